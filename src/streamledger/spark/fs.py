"""The file systems a Spark session writes through: Spark's own Hadoop ``FileSystem`` (reached
through a classic session's JVM) and the choice :func:`for_session` makes for a job. The
framework-neutral interface and the local and ``pyarrow`` implementations are :mod:`streamledger.fs`.
"""

from __future__ import annotations

import uuid
from typing import Any

from streamledger.fs import ATOMIC_RENAME_SCHEMES, LOCAL, ArrowFS, OutputFS, scheme

__all__ = ["HadoopFS", "for_session", "is_connect"]


class HadoopFS:
    """Spark's own Hadoop ``FileSystem`` (``Path(uri).getFileSystem(hadoopConfiguration)``).

    Whatever the session is configured for works, with its credentials: connector jars
    (``hadoop-aws``, ``gcs-connector``, ``hadoop-azure``) come from ``spark.jars.packages`` or the
    cluster's classpath. Hadoop's ``rename`` returns False instead of raising; every call here raises.
    """

    def __init__(self, spark: Any, *, atomic_rename: bool | None = None) -> None:
        context = spark.sparkContext
        self._jvm = context._jvm
        self._conf = context._jsc.hadoopConfiguration()
        self._atomic = atomic_rename

    def _path(self, uri: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self._conf), path

    def renames_atomically(self, uri: str) -> bool:
        """The setting given, else by the location's scheme (local and HDFS rename atomically)."""
        return scheme(uri) in ATOMIC_RENAME_SCHEMES if self._atomic is None else self._atomic

    def exists(self, uri: str) -> bool:
        fs, path = self._path(uri)
        return bool(fs.exists(path))

    def is_dir(self, uri: str) -> bool:
        fs, path = self._path(uri)
        return bool(fs.exists(path)) and bool(fs.getFileStatus(path).isDirectory())

    def read_bytes(self, uri: str) -> bytes | None:
        fs, path = self._path(uri)
        if not fs.exists(path) or fs.getFileStatus(path).isDirectory():
            return None
        stream = fs.open(path)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self._path(uri)
        fs.mkdirs(path.getParent())
        if not self.renames_atomically(uri):
            self._put(fs, path, data)  # one object PUT: readers see the old or the new one
            return
        tmp_name = f".{path.getName()}.{uuid.uuid4().hex[:8]}.tmp"
        tmp = self._jvm.org.apache.hadoop.fs.Path(path.getParent(), tmp_name)
        self._put(fs, tmp, data)
        fs.delete(path, False)
        if not fs.rename(tmp, path):
            fs.delete(tmp, False)
            raise OSError(f"could not rename {tmp.toString()} to {uri}")

    def create_file(self, uri: str, data: bytes) -> None:
        """Write ``data`` only if nothing is at ``uri`` (FileExistsError otherwise). ``file://``: the
        local exclusive create of :class:`streamledger.fs.LocalFS`; else Hadoop's ``create(path,
        overwrite=false)``, exclusive on HDFS (the NameNode creates the name once), on an object
        store connector a look, then a PUT unless the connector makes it conditional. An ``s3://``
        output the session has no connector for goes through :class:`streamledger.fs.ArrowFS`,
        whose create is a conditional PUT."""
        if scheme(uri) == "file":
            LOCAL.create_file(uri, data)
            return
        fs, path = self._path(uri)
        fs.mkdirs(path.getParent())
        try:
            out = fs.create(path, False)
        except Exception as exc:  # py4j's error wrapping Hadoop's FileAlreadyExistsException
            if "FileAlreadyExists" in str(exc) or bool(fs.exists(path)):
                raise FileExistsError(f"{uri} exists: not replaced") from None
            raise
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    @staticmethod
    def _put(fs: Any, path: Any, data: bytes) -> None:
        out = fs.create(path, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def mkdirs(self, uri: str) -> None:
        fs, path = self._path(uri)
        if not fs.mkdirs(path):
            raise OSError(f"could not create directory {uri}")

    def delete(self, uri: str) -> None:
        fs, path = self._path(uri)
        fs.delete(path, True)

    def rename(self, src: str, dst: str) -> None:
        fs, target = self._path(dst)
        if fs.exists(target):
            raise FileExistsError(f"cannot rename {src} to {dst}: the destination exists")
        fs.mkdirs(target.getParent())
        _, source = self._path(src)
        if not fs.rename(source, target):
            raise OSError(f"could not rename {src} to {dst}")

    def copy_file(self, src: str, dst: str) -> None:
        sfs, source = self._path(src)
        dfs, target = self._path(dst)
        util = self._jvm.org.apache.hadoop.fs.FileUtil
        if not util.copy(sfs, source, dfs, target, False, True, self._conf):
            raise OSError(f"could not copy {src} to {dst}")

    def listdir(self, uri: str) -> list[str]:
        fs, path = self._path(uri)
        if not fs.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in fs.listStatus(path))

    def files(self, uri: str) -> list[str]:
        fs, path = self._path(uri)
        if not fs.exists(path):
            return []
        root = str(fs.getFileStatus(path).getPath().toUri().getPath()).rstrip("/") + "/"
        found = fs.listFiles(path, True)
        out = []
        while found.hasNext():
            full = str(found.next().getPath().toUri().getPath())
            out.append(full[len(root):] if full.startswith(root) else full)
        return sorted(out)



def is_connect(spark: Any) -> bool:
    """A Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def for_session(spark: Any, location: str) -> OutputFS:
    """The file system a job on ``spark`` writes ``location`` through: plain paths locally (as
    before), URIs through the session's Hadoop FS, or pyarrow's on a Connect client and for a scheme
    the session has no Hadoop connector for (``s3://`` without ``hadoop-aws``)."""
    if not scheme(location):
        return LOCAL
    if is_connect(spark):
        return ArrowFS()
    hadoop = HadoopFS(spark)
    try:
        hadoop._path(location)
    except Exception as exc:  # py4j's error: no Hadoop FileSystem for the scheme (no connector jar)
        if "UnsupportedFileSystem" not in str(exc) and "No FileSystem for scheme" not in str(exc):
            raise
        return ArrowFS()  # what the Arrow writer's tasks write through: pyarrow reaches it
    return hadoop
