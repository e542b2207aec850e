"""The data directory on disk: disk queues by name, the metadata file, the directory lock,
and the import of the disk queues an nsqd left there."""

from broker.storage.datadir import DataDirectory, DataPathError, DataPathLocked
from broker.storage.metadata import MetadataFile, MetadataLoadError, MetadataWriteError
from broker.storage.nsqdimport import ImportedQueue, NsqdImportError, import_nsqd_queues
from broker.storage.queuestore import QueueStore

__all__ = ["DataDirectory", "DataPathError", "DataPathLocked", "ImportedQueue", "MetadataFile", "MetadataLoadError",
           "MetadataWriteError", "NsqdImportError", "QueueStore", "import_nsqd_queues"]
