"""The driver JVM's options and Spark settings: the log set-up, and what a local master gets
(the throughput collector, Janino left to C1 longer, uncompressed caches)."""

from __future__ import annotations

from typing import Any

import pytest

from persistence.analytics.spark import LOCAL_GC, LOCAL_JIT, driver_java_options

LOG = "-Dlog4j2.configurationFile=file:/tmp/x/log4j2.properties"


def test_a_local_master_gets_the_throughput_collector_and_a_cluster_driver_does_not() -> None:
    local = driver_java_options("local[*]", LOG).split()
    jit = LOCAL_JIT.split()
    assert local == [LOG, LOCAL_GC, *jit]
    assert LOCAL_GC == "-XX:+UseParallelGC"
    assert jit == [
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=CompileThresholdScaling,org.codehaus.janino.*::*,20.0",
    ]
    assert driver_java_options("local[2]", LOG).split() == [LOG, LOCAL_GC, *jit]
    assert driver_java_options("spark://host:7077", LOG).split() == [LOG]


@pytest.mark.spark
def test_the_test_sessions_jvm_collects_with_the_parallel_collector(spark: Any) -> None:
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {bean.getName() for bean in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names


@pytest.mark.spark
def test_the_test_sessions_jvm_leaves_janino_to_c1_longer_and_caches_uncompressed(
    spark: Any,
) -> None:
    runtime = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert set(LOCAL_JIT.split()) <= set(arguments), arguments
    assert spark.conf.get("spark.sql.inMemoryColumnarStorage.compressed") == "false"


def test_a_setting_given_overrides_a_local_masters_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``conf`` wins over :data:`LOCAL_CONF` (checked on the builder, no JVM started)."""
    from pyspark.sql import SparkSession

    from persistence.analytics import spark as session

    given: dict[str, str] = {}

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

    class _Stop(Exception):
        pass

    monkeypatch.setattr(SparkSession, "builder", Builder())
    with pytest.raises(_Stop):
        session.spark_session(
            "local[2]", conf={"spark.sql.inMemoryColumnarStorage.compressed": "true"}
        )
    assert given["spark.sql.inMemoryColumnarStorage.compressed"] == "true"
    given.clear()
    with pytest.raises(_Stop):
        session.spark_session("spark://host:7077")
    assert "spark.sql.inMemoryColumnarStorage.compressed" not in given
