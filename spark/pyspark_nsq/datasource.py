"""The ``nsq`` data source: Spark's entry point to the reader and writer classes."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .batch_reader import NsqBatchReader
from .options import BatchReadOptions, SinkOptions, SourceOptions, check_read_options
from .schema import SOURCE_SCHEMA, check_source_schema
from .stream_reader import NsqStreamReader
from .writer import NsqStreamWriter, NsqWriter

__all__ = ["NsqDataSource"]


class NsqDataSource(DataSource):
    """Reads nsq topics through a channel and publishes rows to topics.

    ``spark.readStream.format("nsq")`` is an at-least-once streaming source,
    ``spark.read.format("nsq")`` drains a channel once, and
    ``df.write[Stream].format("nsq")`` publishes a ``body`` column. Options are
    checked when the reader or writer is created, before any connection opens;
    a bad one raises :class:`~pyspark_nsq.options.OptionError`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``nsq``."""
        return "nsq"

    def schema(self) -> StructType:
        """The fixed schema of what the source reads; raises OptionError for bad options.

        Spark asks for the schema when a read is defined, so checking the options
        here makes ``load()`` fail rather than the query, later.
        """
        check_read_options(self.options)
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> NsqBatchReader:
        """A batch reader; raises OptionError for bad options."""
        options = BatchReadOptions.parse(self.options)
        check_source_schema(schema)
        return NsqBatchReader(options)

    def streamReader(self, schema: StructType) -> NsqStreamReader:
        """A streaming reader; raises OptionError for bad options."""
        options = SourceOptions.parse(self.options)
        check_source_schema(schema)
        return NsqStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> NsqWriter:
        """A batch writer; raises OptionError for bad options."""
        return NsqWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> NsqStreamWriter:
        """A streaming writer; raises OptionError for bad options."""
        return NsqStreamWriter(SinkOptions.parse(self.options), schema)
