"""Streaming queries of the Spark connector, shared by the Spark system tests and the Spark benchmark."""

from __future__ import annotations

from typing import Any

__all__ = ["start_copy"]


def start_copy(spark: Any, nsqd: str, source: str, sink: str, checkpoint: str, *, channel: str,
               trigger: dict, **source_options: str) -> Any:
    """Start a streaming query that copies the bodies of topic ``source`` (read on ``channel``)
    to topic ``sink``, both on the broker at ``nsqd`` (``host:port``).

    ``source_options`` are more options of the source (``maxMessagesPerTrigger="700"``),
    ``trigger`` the keywords of ``DataStreamWriter.trigger``. Returns the running
    ``StreamingQuery``; the caller stops it.
    """
    reader = (spark.readStream.format("nsq").option("nsqd", nsqd)
              .option("topic", source).option("channel", channel))
    for key, value in source_options.items():
        reader = reader.option(key, value)
    return (reader.load().select("body").writeStream.format("nsq")
            .option("nsqd", nsqd).option("topic", sink)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())
