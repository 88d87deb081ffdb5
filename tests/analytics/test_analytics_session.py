"""The Spark session's settings: what a local master gets, and ``conf`` given on top."""

from __future__ import annotations

import os
from typing import Any

import pytest

LOG_OPTION = "-Dlog4j2.configurationFile=file:"


def built_settings(monkeypatch: pytest.MonkeyPatch, master: str, **kwargs: Any) -> dict[str, str]:
    """The settings ``spark_session`` hands Spark's builder (no JVM started)."""
    from pyspark.sql import SparkSession

    from persistence.analytics import spark as session

    given: dict[str, str] = {}

    class _Stop(Exception):
        pass

    class Builder:
        def master(self, _: str) -> Builder:
            return self

        def appName(self, _: str) -> Builder:
            return self

        def config(self, key: str, value: str) -> Builder:
            given[key] = value
            return self

        def getOrCreate(self) -> Any:
            raise _Stop

    monkeypatch.setattr(SparkSession, "builder", Builder())
    with pytest.raises(_Stop):
        session.spark_session(master, **kwargs)
    return given


def test_a_local_master_gets_a_partition_per_core_and_only_the_log_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = built_settings(monkeypatch, "local[2]")
    assert given["spark.sql.shuffle.partitions"] == str(max(2, os.cpu_count() or 2))
    assert given["spark.driver.extraJavaOptions"].startswith(LOG_OPTION)
    assert given["spark.driver.extraJavaOptions"] == given["spark.executor.extraJavaOptions"]
    assert given["spark.ui.enabled"] == "false"
    cluster = built_settings(monkeypatch, "spark://host:7077")
    assert "spark.sql.shuffle.partitions" not in cluster
    assert cluster["spark.driver.extraJavaOptions"].startswith(LOG_OPTION)


def test_a_setting_given_overrides_the_sessions_own(monkeypatch: pytest.MonkeyPatch) -> None:
    given = built_settings(
        monkeypatch,
        "local[2]",
        conf={
            "spark.sql.shuffle.partitions": "7",
            "spark.sql.inMemoryColumnarStorage.batchSize": "5",
        },
    )
    assert given["spark.sql.shuffle.partitions"] == "7"
    assert given["spark.sql.inMemoryColumnarStorage.batchSize"] == "5"


@pytest.mark.spark
def test_the_test_sessions_jvm_keeps_javas_own_collector(spark: Any) -> None:
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert not [a for a in arguments if a.startswith(("-XX:+Use", "-XX:CompileCommand"))], arguments
