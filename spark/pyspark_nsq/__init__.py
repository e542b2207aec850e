"""Apache Spark connector for nsq (pynsqd or nsqd): the ``nsq`` Python data source.

Importing this package is enough for Spark to find the source: Spark registers the
``DefaultSource`` of every importable top-level ``pyspark_<name>`` module, so after
installation ``spark.readStream.format("nsq")`` works without further setup. In a
session where the package is not installed for Spark's Python workers, register it
by hand::

    from pyspark_nsq import NsqDataSource
    spark.dataSource.register(NsqDataSource)
"""

from broker.client import NsqError

from .datasource import NsqDataSource
from .options import OptionError
from .schema import SOURCE_SCHEMA
from .version import __version__

#: The class Spark's automatic discovery looks for.
DefaultSource = NsqDataSource

__all__ = ["NsqDataSource", "DefaultSource", "OptionError", "NsqError", "SOURCE_SCHEMA", "__version__"]
