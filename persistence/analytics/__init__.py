"""Spark analytics of node databases: what every flow is doing, and whether exactly-once holds.

Read the checkpoint, dedup-id and outbox tables of one or more node databases (SQLite or
PostgreSQL) from a consistent snapshot into Spark (JDBC, or SQLAlchemy into Arrow and
Parquet when no driver jar is found), run the checks and report. PySpark is imported only
when a function needs it, so this package imports without it. See ``docs/analytics.md``.

    from persistence.analytics import (
        CheckSettings, load_nodes, parse_node_argument, run_checks, spark_session,
    )

    spark = spark_session("local[*]", jars=find_jdbc_jars().paths())
    sources = [parse_node_argument("O=Alice,L=London,C=GB=sqlite:///alice.db")]
    with load_nodes(spark, sources) as snapshot:
        for result in run_checks(snapshot, CheckSettings()):
            print(result.name, result.verdict)
"""

from persistence.analytics.check_results import (
    FAIL,
    INFO,
    OK,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
)
from persistence.analytics.checks import (
    CHECKS,
    checkpoint_blobs,
    checkpoint_costs,
    exactly_once_audit,
    failed_flows,
    flow_counts,
    flows_over_time,
    node_integrity,
    run_checks,
    session_consistency,
    session_ownership,
    stuck_flows,
)
from persistence.analytics.loading import load_nodes
from persistence.analytics.report import (
    AnalysisReport,
    collect_report,
    render_text,
    report_json,
)
from persistence.analytics.report_html import render_html
from persistence.analytics.running import analyze
from persistence.analytics.snapshot import NodeLoad, Snapshot
from persistence.analytics.sources import (
    JdbcJars,
    NodeArgumentError,
    NodeSource,
    find_jdbc_jars,
    parse_node_argument,
)
from persistence.analytics.spark import spark_problem, spark_session, stop_spark
from persistence.analytics.tables import AnalyticsLoadError

__all__ = [
    "CHECKS",
    "FAIL",
    "INFO",
    "OK",
    "WARN",
    "AnalysisReport",
    "AnalyticsLoadError",
    "CheckResult",
    "CheckSettings",
    "JdbcJars",
    "NodeArgumentError",
    "NodeLoad",
    "NodeSource",
    "Snapshot",
    "Verdict",
    "analyze",
    "checkpoint_blobs",
    "checkpoint_costs",
    "collect_report",
    "exactly_once_audit",
    "failed_flows",
    "find_jdbc_jars",
    "flow_counts",
    "flows_over_time",
    "load_nodes",
    "node_integrity",
    "parse_node_argument",
    "render_html",
    "render_text",
    "report_json",
    "run_checks",
    "session_consistency",
    "session_ownership",
    "spark_problem",
    "spark_session",
    "stop_spark",
    "stuck_flows",
]
