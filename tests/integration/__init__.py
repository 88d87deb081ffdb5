"""The integration tier: tests against PostgreSQL and RabbitMQ (``pytest tests/integration``)."""
