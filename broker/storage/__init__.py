"""The data directory on disk: disk queues by name, the metadata file, the directory lock."""

from broker.storage.datadir import DataDirectory, DataPathError, DataPathLocked
from broker.storage.metadata import MetadataFile, MetadataLoadError, MetadataWriteError
from broker.storage.queuestore import QueueStore

__all__ = ["DataDirectory", "DataPathError", "DataPathLocked", "MetadataFile", "MetadataLoadError", "MetadataWriteError", "QueueStore"]
