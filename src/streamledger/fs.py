"""Output locations as URIs: the one file-system interface the batch core and the job write through.

Three implementations, chosen by :func:`filesystem_for` (the batch) and
:func:`streamledger.spark.fs.for_session` (a job):

* :data:`LOCAL` (``os``/``shutil``) for plain paths, exactly the behaviour before URIs existed: no
  Spark is needed to verify or publish;
* :class:`streamledger.spark.fs.HadoopFS`, Spark's own Hadoop ``FileSystem`` reached through a
  classic session's JVM, so every scheme Spark is configured for works with Spark's configuration and
  credentials (``file://``, ``hdfs://``, ``s3a://``, ``gs://``, ``abfs://``). It lives in the Spark
  layer (this module reaches no JVM and imports nothing of Spark's);
* :class:`ArrowFS`, ``pyarrow.fs`` from the same URI, for a Spark Connect client (it has no JVM to
  reach Hadoop through) and for runners without a session (spark-submit). It needs the caller's
  own access to the store (pyarrow reads the usual ``AWS_*`` / Google / Azure environment).

``renames_atomically(uri)`` says whether a directory rename is one atomic step (local, HDFS). On object stores
it is a copy and a delete; the batch's publish then copies the data files and writes the manifest
last, so a destination is complete exactly when its ``_manifest.json`` is there.

``create_file(uri, data)`` writes a file only where none is (PUT-if-absent), else raises
``FileExistsError`` and leaves what is there: the publish writes a manifest with it, so of two
attempts publishing one range the later manifest is refused instead of replacing the first. Locally
an exclusive create (a temp file hard-linked to the name: ``link`` fails when the name exists, and the
file is whole when it appears); on S3 a ``PutObject`` with ``If-None-Match: *`` through botocore
(``pyarrow.fs`` cannot send that header; the store refuses with 412). Elsewhere (GCS, Azure through
pyarrow) the name is looked up first: a window between the look and the write remains there.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from streamledger.errors import StreamledgerError, extra_problem, missing_extra

ATOMIC_RENAME_SCHEMES = frozenset({"", "file", "hdfs", "viewfs"})
"""Schemes whose directory rename is atomic (a metadata operation): local file systems and HDFS."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")

_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs", "wasb": "abfs", "wasbs": "abfs"}
"""Hadoop connector schemes and the name pyarrow knows the same store by."""


class OutputFS(Protocol):
    """What the batch and the job do to output locations (every location is a URI or plain path)."""

    def renames_atomically(self, uri: str) -> bool: ...
    def exists(self, uri: str) -> bool: ...
    def is_dir(self, uri: str) -> bool: ...
    def read_bytes(self, uri: str) -> bytes | None: ...
    def write_bytes(self, uri: str, data: bytes) -> None: ...
    def create_file(self, uri: str, data: bytes) -> None: ...
    def mkdirs(self, uri: str) -> None: ...
    def delete(self, uri: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def copy_file(self, src: str, dst: str) -> None: ...
    def listdir(self, uri: str) -> list[str]: ...
    def files(self, uri: str) -> list[str]: ...


# -- URI helpers (pure) --------------------------------------------------------------------------


def scheme(location: str) -> str:
    """``s3a`` for ``s3a://b/k``; ``""`` for a plain path (a Windows drive letter is no scheme)."""
    found = _SCHEME.match(location)
    return found.group(1).lower() if found else ""


def join(base: str, *parts: str) -> str:
    """``base/part/...``: plain paths through pathlib (as before URIs), URIs by string."""
    if not scheme(base):
        return str(Path(base).joinpath(*parts))
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def parent(location: str) -> str:
    if not scheme(location):
        return str(Path(location).parent)
    return location.rstrip("/").rsplit("/", 1)[0]


def name(location: str) -> str:
    if not scheme(location):
        return Path(location).name
    return location.rstrip("/").rsplit("/", 1)[-1]


STORE_SCHEMES = frozenset({"s3", "gs", "abfs", "hdfs", "viewfs", *_ARROW_SCHEMES})
"""URI schemes of the stores the batch reaches (through pyarrow, or the Spark session's Hadoop FS)."""


def location_problem(location: str) -> str | None:
    """Why no file system of the batch reaches ``location``, or None: a plain path, ``file://`` or
    a store of :data:`STORE_SCHEMES` (an object store's URI must name its bucket)."""
    kind = scheme(location)
    if kind in ("", "file"):
        return None
    if kind not in STORE_SCHEMES:
        return (f"no file system of the batch takes the scheme {kind!r} (a path, file:// or one of "
                f"{', '.join(sorted(STORE_SCHEMES))})")
    if kind not in ("hdfs", "viewfs") and not urlsplit(location).netloc:
        return f"the {kind}:// URI names no bucket"
    return credentials_problem(location)


def credentials_problem(location: str) -> str | None:
    """Why ``location`` cannot be an output: an S3 or GCS URI carrying ``user:secret@`` (taken for
    the bucket, it would show in every error, manifest and ledger row), or None. Other schemes'
    ``@`` is their own (Azure's ``container@account``, HDFS's user)."""
    kind = scheme(location)
    if _ARROW_SCHEMES.get(kind, kind) not in ("s3", "gs") or "@" not in urlsplit(location).netloc:
        return None
    return "credentials in the URI are refused; give them in the environment (AWS_* for S3)"


def local_path(location: str) -> Path:
    """A local (or shared POSIX) path from ``/x`` or ``file:///x``; other schemes are refused."""
    if location.startswith("file://"):
        location = unquote(urlsplit(location).path)
    if scheme(location):
        raise ValueError(f"output {location!r} is not a local path (no file system for it here)")
    return Path(location).absolute()


# -- local -------------------------------------------------------------------------------------


class LocalFS:
    """Plain paths and ``file://``, with ``os``: a manifest is written to a temp file and renamed."""

    def __init__(self, *, atomic_rename: bool = True) -> None:
        self._atomic = atomic_rename

    def renames_atomically(self, uri: str) -> bool:
        return self._atomic

    def exists(self, uri: str) -> bool:
        return local_path(uri).exists()

    def is_dir(self, uri: str) -> bool:
        return local_path(uri).is_dir()

    def read_bytes(self, uri: str) -> bytes | None:
        path = local_path(uri)
        return path.read_bytes() if path.is_file() else None

    def write_bytes(self, uri: str, data: bytes) -> None:
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def create_file(self, uri: str, data: bytes) -> None:
        """Write ``data`` to ``uri`` only if nothing is there (FileExistsError otherwise): a whole
        temp file hard-linked to the name, so the file appears complete or not at all; where the file
        system has no hard links, an ``O_EXCL`` create."""
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(f"{uri} exists: not replaced") from None
        except OSError as exc:  # no hard links here (EPERM, ENOTSUP, ...): an exclusive create
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            try:
                with open(path, "xb") as out:
                    out.write(data)
            except FileExistsError:
                raise FileExistsError(f"{uri} exists: not replaced") from None
        finally:
            tmp.unlink(missing_ok=True)

    def mkdirs(self, uri: str) -> None:
        local_path(uri).mkdir(parents=True, exist_ok=True)

    def delete(self, uri: str) -> None:
        path = local_path(uri)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def rename(self, src: str, dst: str) -> None:
        target = local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise FileExistsError(f"cannot rename {src} to {dst}: the destination exists")
        os.rename(local_path(src), target)

    def copy_file(self, src: str, dst: str) -> None:
        target = local_path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local_path(src), target)

    def listdir(self, uri: str) -> list[str]:
        path = local_path(uri)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []

    def files(self, uri: str) -> list[str]:
        root = local_path(uri)
        if not root.is_dir():
            return []
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


LOCAL = LocalFS()


# -- pyarrow.fs (Spark Connect clients, spark-submit) ---------------------------------------------


class LocationError(StreamledgerError):
    """An output location no file system here can reach: an unknown scheme, a missing bucket,
    missing credentials, an unreachable store."""


_S3_ENV = {"access_key": ("AWS_ACCESS_KEY_ID",), "secret_key": ("AWS_SECRET_ACCESS_KEY",),
           "session_token": ("AWS_SESSION_TOKEN",), "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
           "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")}


@dataclass(frozen=True)
class StoreAccess:
    """How a process reaches an object store, resolved once where the job starts (from its
    environment) and carried to the Spark tasks with their work: a task's Python worker does not see
    the environment of the process that started the job (a JVM started earlier, a Connect server).
    The secrets never show in a repr; the record travels pickled with the task, like the broker URL,
    never on a command line or in a log. Empty fields: the task's own environment decides."""

    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint: str | None = None

    @classmethod
    def from_environment(cls, uri: str, environ: Any = None) -> StoreAccess | None:
        """The ``AWS_*`` settings for an ``s3``/``s3a`` location (None for other schemes, or when
        none is set: then pyarrow's own chain, e.g. an instance role, applies in the task)."""
        if _ARROW_SCHEMES.get(scheme(uri), scheme(uri)) != "s3":
            return None
        return cls.s3_environment(environ)

    @classmethod
    def s3_environment(cls, environ: Any = None) -> StoreAccess | None:
        """The environment's ``AWS_*`` settings whatever the location (a table catalog reaches S3
        for tables anywhere); None when none is set."""
        env = os.environ if environ is None else environ
        found = {k: next((env[n] for n in names if env.get(n)), None) for k, names in _S3_ENV.items()}
        return cls(**found) if any(found.values()) else None

    @property
    def plain_http(self) -> bool:
        """The endpoint is ``http://`` (a store on a private network or loopback): pyarrow follows
        it as given, delta-rs only when told (``AWS_ALLOW_HTTP``)."""
        return bool(self.endpoint and self.endpoint.lower().startswith("http://"))

    def s3(self) -> Any:
        import pyarrow.fs as pafs

        kwargs: dict[str, Any] = {"access_key": self.access_key, "secret_key": self.secret_key,
                                  "session_token": self.session_token, "region": self.region}
        if self.endpoint:
            parts = urlsplit(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
            kwargs["scheme"], kwargs["endpoint_override"] = parts.scheme, parts.netloc
        return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})

    def boto3_client(self) -> Any:
        """A botocore S3 client with exactly these settings (empty ones: boto3's own chain), for the
        one request ``pyarrow.fs`` cannot send: a conditional PUT."""
        import boto3  # the s3 extra (s3_create says when it is missing)

        kwargs = {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key,
                  "aws_session_token": self.session_token, "region_name": self.region}
        if self.endpoint:
            kwargs["endpoint_url"] = self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}"
        return boto3.client("s3", **{k: v for k, v in kwargs.items() if v is not None})


def s3_create(uri: str, data: bytes, access: StoreAccess | None,
              clients: dict[StoreAccess | None, Any] | None = None) -> None:
    """PUT ``data`` at the S3 location ``uri`` with ``If-None-Match: *``: the store writes it only if
    no object has that key, else answers 412 (or 409 while another conditional PUT of the key is in
    flight), raised here as ``FileExistsError``. Needs boto3 (``pip install 'streamledger[s3]'``); one
    client per ``access`` in ``clients``."""
    try:
        import boto3  # noqa: F401 - the s3 extra
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        advice = missing_extra(ModuleNotFoundError(name="boto3"))
        raise LocationError(f"{redact(uri)}: a create-only write on S3 (a PUT with If-None-Match) needs "
                            f"boto3; {advice}") from None
    parts = urlsplit(uri)
    bucket, key = parts.netloc.split("@", 1)[-1], unquote(parts.path).lstrip("/")
    store = clients.get(access) if clients is not None else None
    if store is None:
        store = (access or StoreAccess()).boto3_client()
        if clients is not None:
            clients[access] = store
    try:
        store.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code")
        if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            raise FileExistsError(f"{redact(uri)} exists: not replaced (the store refused the "
                                  f"conditional PUT: {code or status})") from None
        raise OSError(f"{redact(uri)}: {first_line(exc)}") from None
    except BotoCoreError as exc:
        raise OSError(f"{redact(uri)}: {first_line(exc)}") from None


def arrow_filesystem(uri: str, cache: dict[tuple[str, str], Any] | None = None,
                     access: StoreAccess | None = None) -> tuple[Any, str]:
    """``(pyarrow.fs.FileSystem, path)`` for a location: the local file system for plain paths and
    ``file://``; else from the URI (Hadoop connector schemes mapped to pyarrow's), one file system per
    scheme and bucket in ``cache``; an S3 location with ``access`` through exactly those settings.
    An unknown scheme is a :class:`LocationError`."""
    import pyarrow.fs as pafs

    kind = scheme(uri)
    if kind in ("", "file"):
        key: tuple[str, str] = ("file", "")
        path = str(local_path(uri))
    else:
        parts = urlsplit(uri)
        arrow = _ARROW_SCHEMES.get(kind, kind)
        key = (arrow, parts.netloc)
        if arrow in ("hdfs", "viewfs"):
            path = unquote(parts.path)
        else:  # object stores: bucket/key (abfs: container@account.../path -> container/path)
            bucket = parts.netloc.split("@", 1)[0]
            path = f"{bucket}{unquote(parts.path)}".rstrip("/")
    fs = cache.get(key) if cache is not None else None
    if fs is None:
        if key[0] == "file":
            fs = pafs.LocalFileSystem()
        elif key[0] == "s3" and access is not None:
            fs = access.s3()
        else:
            asked = f"{key[0]}://{parts.netloc}{parts.path}"
            try:
                fs, _ = pafs.FileSystem.from_uri(asked)
            except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
                said = first_line(exc).replace(asked, redact(asked)).replace(uri, redact(uri))
                raise LocationError(f"output {redact(uri)}: no file system for it here ({said})") from None
        if cache is not None:
            cache[key] = fs
    return fs, path


_CREDENTIAL_SOURCES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                       "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
"""Settings naming a source of S3 credentials other than the two keys (the AWS SDK's chain)."""


def credentials_missing(uri: str, environ: Any = None) -> str | None:
    """Why no request to an S3 location could be signed, when that is known without asking the
    store, else None: a key id without its secret (or the reverse), or no source of credentials at
    all (no keys, no profile, no shared credentials or config file, no web identity or container
    credentials, and the instance metadata service switched off). pyarrow would send such requests
    unsigned: a real store refuses them only once the job writes, an S3-compatible one may accept."""
    if _ARROW_SCHEMES.get(scheme(uri), scheme(uri)) != "s3":
        return None
    env = os.environ if environ is None else environ
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if bool(key) != bool(secret):
        have, lack = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if key else (
            "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
        return f"{have} is set but not {lack}"
    if key or any(env.get(n) for n in _CREDENTIAL_SOURCES):
        return None
    if str(env.get("AWS_EC2_METADATA_DISABLED", "")).lower() != "true":
        return None  # an instance role may answer: only the store can tell
    home = Path(env.get("HOME") or Path.home())
    files = [env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials",
             env.get("AWS_CONFIG_FILE") or home / ".aws" / "config"]
    if any(Path(f).is_file() for f in files):
        return None
    return ("no credentials for the store (no AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profile, shared "
            "credentials file, web identity or container credentials; instance metadata disabled)")


def check_location(uri: str, what: str = "output") -> None:
    """Refuse, in one line naming the location (as ``what``), an output no task could write: an
    unknown scheme, credentials in the URI or missing, a bucket (container) that does not exist,
    credentials the store refuses, a store that does not answer. Plain paths and ``file://`` pass
    (a directory is created on write), before pyarrow is imported (a batch process's first, for an
    idle batch maybe its only, use of it). One metadata call."""
    if scheme(uri) in ("", "file"):
        return
    import pyarrow.fs as pafs

    problem = credentials_problem(uri) or credentials_missing(uri)
    if problem is not None:
        raise LocationError(f"{what} {redact(uri)}: {problem}")
    try:
        fs, path = arrow_filesystem(uri, access=StoreAccess.from_environment(uri))
    except LocationError as exc:
        raise LocationError(f"{what} {str(exc).removeprefix('output ')}") from None
    if _ARROW_SCHEMES.get(scheme(uri), scheme(uri)) in ("hdfs", "viewfs"):
        root, where = "/", "the file system"
    else:
        root, where = path.split("/", 1)[0], f"bucket {path.split('/', 1)[0]!r}"
    try:
        found = fs.get_file_info(root).type
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
        raise LocationError(f"{what} {redact(uri)}: {where} cannot be reached ({first_line(exc)})") from None
    if found == pafs.FileType.NotFound:
        raise LocationError(f"{what} {redact(uri)}: {where} does not exist")


def redact(uri: str) -> str:
    """``uri`` without a user:password part (never in an error line)."""
    parts = urlsplit(uri) if scheme(uri) else None
    if parts is None or "@" not in parts.netloc or scheme(uri).startswith(("abfs", "wasb")):
        return uri
    return uri.replace(parts.netloc, "***@" + parts.netloc.rsplit("@", 1)[1], 1)


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (one-line messages quote the cause, not its traceback)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class ArrowFS:
    """``pyarrow.fs`` from the location's URI, for callers without a JVM (a Spark Connect client).

    Hadoop connector schemes map to pyarrow's (``s3a`` -> ``s3``, ``abfss`` -> ``abfs``); pyarrow
    takes credentials from its own environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``,
    Azure's), not from Spark's configuration. Object stores have no directory rename: ``rename``
    copies and deletes.
    """

    def __init__(self, *, atomic_rename: bool | None = None) -> None:
        self._atomic = atomic_rename
        self._cache: dict[tuple[str, str], Any] = {}
        self._s3: dict[StoreAccess | None, Any] = {}  # botocore clients, for conditional PUTs

    def renames_atomically(self, uri: str) -> bool:
        return scheme(uri) in ATOMIC_RENAME_SCHEMES if self._atomic is None else self._atomic

    def _path(self, uri: str) -> tuple[Any, str]:
        return arrow_filesystem(uri, self._cache, StoreAccess.from_environment(uri))

    def _type(self, uri: str) -> Any:
        fs, path = self._path(uri)
        return fs.get_file_info(path).type

    def exists(self, uri: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self._type(uri) != pafs.FileType.NotFound)

    def is_dir(self, uri: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self._type(uri) == pafs.FileType.Directory)

    def read_bytes(self, uri: str) -> bytes | None:
        import pyarrow.fs as pafs

        fs, path = self._path(uri)
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read())

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self._path(uri)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if not self.renames_atomically(uri):
            with fs.open_output_stream(path) as out:  # one object PUT
                out.write(data)
            return
        head, _, tail = path.rpartition("/")
        tmp = f"{head}/.{tail}.{uuid.uuid4().hex[:8]}.tmp"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)

    def create_file(self, uri: str, data: bytes) -> None:
        """Write ``data`` only if nothing is at ``uri`` (FileExistsError otherwise): locally an
        exclusive create, on S3 a conditional PUT; elsewhere a look, then one PUT."""
        kind = _ARROW_SCHEMES.get(scheme(uri), scheme(uri))
        if kind in ("", "file"):
            LOCAL.create_file(uri, data)
            return
        if kind == "s3":
            s3_create(uri, data, StoreAccess.from_environment(uri), self._s3)
            return
        if self.exists(uri):
            raise FileExistsError(f"{redact(uri)} exists: not replaced")
        fs, path = self._path(uri)
        with fs.open_output_stream(path) as out:  # one object PUT
            out.write(data)

    def mkdirs(self, uri: str) -> None:
        fs, path = self._path(uri)
        fs.create_dir(path, recursive=True)

    def delete(self, uri: str) -> None:
        import pyarrow.fs as pafs

        fs, path = self._path(uri)
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind != pafs.FileType.NotFound:
            fs.delete_file(path)

    def rename(self, src: str, dst: str) -> None:
        if self.exists(dst):
            raise FileExistsError(f"cannot rename {src} to {dst}: the destination exists")
        self.mkdirs(parent(dst))
        if self.renames_atomically(dst):
            fs, source = self._path(src)
            fs.move(source, self._path(dst)[1])
            return
        for rel in self.files(src):  # object stores: no directory rename
            self.copy_file(join(src, rel), join(dst, rel))
        self.delete(src)

    def copy_file(self, src: str, dst: str) -> None:
        fs, source = self._path(src)
        target = self._path(dst)[1]
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        fs.copy_file(source, target)

    def listdir(self, uri: str) -> list[str]:
        import pyarrow.fs as pafs

        if not self.is_dir(uri):
            return []
        fs, path = self._path(uri)
        return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path)))

    def files(self, uri: str) -> list[str]:
        import pyarrow.fs as pafs

        if not self.is_dir(uri):
            return []
        fs, path = self._path(uri)
        root = path.rstrip("/") + "/"
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return sorted(i.path[len(root):] for i in infos if i.type == pafs.FileType.File)


# -- who holds the file system -------------------------------------------------------------------


def create_library_problem(location: str, store: Callable[[], OutputFS]) -> str | None:
    """Why a publish under ``location`` cannot write its manifest create-only here, or None: on S3
    through pyarrow the conditional PUT needs boto3, the ``s3`` extra; a session's Hadoop connector
    needs nothing more. ``s3://`` is pyarrow's (Hadoop's connector is ``s3a://``); for ``s3a://`` and
    ``s3n://`` the runner's file system (``store()``, asked only then: it may start a session) says."""
    if _ARROW_SCHEMES.get(scheme(location), scheme(location)) != "s3":
        return None
    problem = extra_problem("boto3")
    if problem is None or (scheme(location) != "s3" and not isinstance(store(), ArrowFS)):
        return None
    return f"output root {redact(location)} on S3 (its manifests are written create-only): {problem}"


def filesystem_for(location: str, runner: Any = None) -> OutputFS:
    """The batch's file system for ``location``: plain paths are local (no Spark needed to verify
    or publish); a URI asks the runner (``runner.filesystem(location)``, optional), else ``file://``
    is local and other schemes go through pyarrow."""
    if not scheme(location):
        return LOCAL
    factory = getattr(runner, "filesystem", None)
    if callable(factory):
        fs: OutputFS = factory(location)
        return fs
    if scheme(location) == "file":
        return LOCAL
    return ArrowFS()
