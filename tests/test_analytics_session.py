"""The driver JVM's options: the log set-up, the class archive, the collector of a local master."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persistence.analytics.class_archive import ClassArchive
from persistence.analytics.session import LOCAL_GC, driver_java_options

LOG = "-Dlog4j2.configurationFile=file:/tmp/x/log4j2.properties"


def test_a_local_master_gets_the_throughput_collector_and_a_cluster_driver_does_not() -> None:
    archive = ClassArchive("-XX:SharedArchiveFile=/c/a.jsa", Path("/c/a.jsa"), None)
    local = driver_java_options("local[*]", LOG, archive).split()
    assert local == [LOG, "-XX:SharedArchiveFile=/c/a.jsa", LOCAL_GC]
    assert LOCAL_GC == "-XX:+UseParallelGC"
    assert driver_java_options("local[2]", LOG, None).split() == [LOG, LOCAL_GC]
    assert driver_java_options("spark://host:7077", LOG, None).split() == [LOG]


@pytest.mark.spark
def test_the_test_sessions_jvm_collects_with_the_parallel_collector(spark: Any) -> None:
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {bean.getName() for bean in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
