"""Where traces come from: a local path or an fsspec URL (``s3://``, ``gs://``, ``az://``, ``file://``).

The one place a URL is understood. ``trace_path`` turns what a user typed into a ``Path`` (plain paths and
``file://``) or a ``RemotePath``, which answers the few questions the ingest asks of a file (its name, size and
version, its neighbours, a stream of its bytes) through fsspec. Light: no numpy, and fsspec is imported only when a
remote URL is first used, so a training job capturing to a local folder never imports it.

Credentials and endpoints come from each ecosystem's own configuration (for S3: ``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, the usual credential chain; for GCS: Google's default credentials, ``STORAGE_EMULATOR_HOST``; for
Azure: ``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT_NAME`` with a key, SAS token or service
principal; for any of them fsspec's ``FSSPEC_<PROTOCOL>_<OPTION>``); nothing here reads or keeps a secret. A URL
is shown and stored without its user info and query (``redact_url``): ``s3://key:secret@bucket/x?token=...`` reads
``s3://bucket/x`` (but for Azure's ``az://container@account.blob.core.windows.net/x``, whose user part is the
container).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import unquote, urlsplit, urlunsplit

from kinetoscope.errors import ConfigError, TraceSourceError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: protocol -> (the fsspec implementation's module, the Kinetoscope extra that installs it)
EXTRAS = {
    "s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
}
#: bytes fetched per ranged read of a remote file: what a stream holds at once (the scanner reads 8 MiB chunks)
BLOCK_BYTES = 8 * 2**20
#: Azure's fully qualified form, ``abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/path``: the user part is the
#: container (no password, never a secret), the host names the account
_AZURE_PROTOCOLS = ("az", "abfs", "abfss")
_AZURE_ACCOUNT_HOST = re.compile(r"^[a-z0-9]+\.(dfs|blob)\.core\.windows\.net$", re.IGNORECASE)


def _azure_container(scheme: str, username: str | None, password: str | None, host: str) -> bool:
    """Whether a URL's user part is an Azure container (``abfs://container@account.dfs.core.windows.net``)."""
    return (scheme.lower() in _AZURE_PROTOCOLS and bool(username) and password is None
            and _AZURE_ACCOUNT_HOST.match(host) is not None)


def is_url(text: str | os.PathLike[str]) -> bool:
    """Whether ``text`` names a remote object (a scheme other than ``file://``)."""
    m = _SCHEME.match(os.fspath(text)) if isinstance(text, str) else None
    return m is not None and m.group(1).lower() != "file"


def redact_url(text: str) -> str:
    """``text`` without a URL's user info, query and fragment: what may be shown, logged or stored."""
    if not _SCHEME.match(text):
        return text
    parts = urlsplit(text)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if _azure_container(parts.scheme, parts.username, parts.password, parts.hostname or ""):
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def trace_path(text: str | os.PathLike[str] | RemotePath) -> Path | RemotePath:
    """A path as the ingest takes it: ``file://`` and plain paths are local ``Path`` objects, other URLs remote."""
    if isinstance(text, (Path, RemotePath)):
        return text
    s = os.fspath(text)
    m = _SCHEME.match(s)
    if m is None:
        return Path(s)
    if m.group(1).lower() == "file":
        return Path(unquote(urlsplit(s).path))
    return RemotePath(s)


@dataclass(frozen=True)
class RemoteStat:
    """What ``stat`` says of a remote object: its size, when it last changed (0 where the store does not say) and
    its version (an ETag or generation where the store has one, else size and mtime)."""

    st_size: int
    st_mtime: float
    version: str

    @property
    def st_mtime_ns(self) -> int:
        return int(self.st_mtime * 1e9)


class RemotePath:
    """A file or folder in an object store, by URL. Its methods raise ``OSError`` (as ``Path``'s do) for what the
    store answers, with the URL redacted; a missing extra is a ``ConfigError`` naming it."""

    __slots__ = ("protocol", "_key", "_account", "listed")

    def __init__(self, url: str, listed: dict[str, Any] | None = None) -> None:
        m = _SCHEME.match(url)
        if m is None:
            raise TraceSourceError(f"{redact_url(url)}: not a URL")
        self.protocol = m.group(1).lower()
        # user info and query are dropped, never used: credentials come from the store's own configuration
        parts = urlsplit(url)
        #: Azure's account host where the URL names it (``container@account.dfs.core.windows.net``), else ""
        self._account = ""
        if _azure_container(self.protocol, parts.username, parts.password, parts.hostname or ""):
            self._account = parts.hostname or ""
            self._key = (f"{parts.username}{parts.path}").rstrip("/")
        else:
            self._key = ((parts.hostname or "") + parts.path).rstrip("/")
        #: what the listing that found this object said of it (size, ETag): its version without asking again
        self.listed = listed

    def _at(self, key: str, listed: dict[str, Any] | None = None) -> RemotePath:
        """The object at ``key`` (a bucket's or container's name, then the path) in the same store."""
        return RemotePath(f"{self.protocol}://{_with_account(key, self._account)}", listed)

    # -- naming --
    def __str__(self) -> str:
        return f"{self.protocol}://{_with_account(self._key, self._account)}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def name(self) -> str:
        return self._key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return self._at(self._key.rsplit('/', 1)[0])

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{self}/{name.strip('/')}")

    # -- the store --
    def _fs(self) -> Any:
        module, extra = EXTRAS.get(self.protocol, (None, None))
        try:
            import fsspec
        except ImportError:
            raise ConfigError(f"{self}: reading {self.protocol}:// URLs needs fsspec: pip install "
                              f"'kinetoscope[{extra or 's3'}]'") from None
        try:
            cls = fsspec.get_filesystem_class(self.protocol)
        except ImportError as exc:
            if module is None:  # a protocol fsspec knows and Kinetoscope has no extra for (http://, ...)
                raise ConfigError(f"{self}: {self.protocol}:// URLs need fsspec's implementation of them "
                                  f"({_first_line(exc)})") from None
            raise ConfigError(f"{self}: {self.protocol}:// URLs need {module}: pip install "
                              f"'kinetoscope[{extra}]'") from None
        except ValueError:
            raise ConfigError(f"{self}: unknown protocol {self.protocol}:// (s3://, gs://, az:// and file:// are "
                              "understood)") from None
        # no listings cache: a watch asks again and again, and must see what changed since (a manifest landing)
        try:
            return cls(use_listings_cache=False, **cls._get_kwargs_from_urls(str(self)))
        except Exception as exc:  # noqa: BLE001 - the client's own configuration error (a bad profile, ...)
            raise ConfigError(f"{self}: cannot open the store ({type(exc).__name__}: {_first_line(exc)})") from None

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError:
            raise
        except FileNotFoundError:
            raise FileNotFoundError(2, "no such file or directory") from None
        except PermissionError as exc:
            raise PermissionError(13, f"permission denied ({_first_line(exc)})") from None
        except Exception as exc:  # noqa: BLE001 - a store's client raises its own (botocore, aiohttp...)
            raise OSError(f"{what} failed: {type(exc).__name__}: {_first_line(exc)}") from None

    def info(self) -> dict[str, Any]:
        return dict(self._call("stat", self._fs().info, self._key))

    def stat(self) -> RemoteStat:
        return remote_stat(self.info())

    def exists(self) -> bool:
        try:
            self.info()
        except FileNotFoundError:
            return False
        return True

    def is_file(self) -> bool:
        try:
            return self.info().get("type") == "file"
        except FileNotFoundError:
            return False

    def is_dir(self) -> bool:
        try:
            return self.info().get("type") == "directory"
        except FileNotFoundError:
            return False

    def listing(self) -> list[tuple[RemotePath, dict[str, Any]]]:
        """The folder's entries with what the store says of each, listed afresh (never a cached listing)."""
        entries = self._call("list", self._fs().ls, self._key, detail=True)
        out = []
        for e in entries:
            key = str(e.get("name", "")).rstrip("/")
            if not key or key == self._key:
                continue
            out.append((self._at(key, e), e))
        return sorted(out, key=lambda pair: str(pair[0]))

    def walk(self) -> dict[RemotePath, list[tuple[RemotePath, dict[str, Any]]]]:
        """Every object under this prefix, by folder, listed afresh in one recursive listing (what ``os.walk``
        gives of a local tree)."""
        found = self._call("list", self._fs().find, self._key, detail=True)
        folders: dict[RemotePath, list[tuple[RemotePath, dict[str, Any]]]] = {}
        for key, info in sorted(found.items()):
            if info.get("type", "file") != "file":
                continue
            path = self._at(key, info)
            folders.setdefault(path.parent, []).append((path, info))
        return folders

    def iterdir(self) -> Iterator[RemotePath]:
        return iter([p for p, _ in self.listing()])

    def open(self, mode: str = "rb", buffering: int = -1) -> BinaryIO:
        """A stream of the object's bytes, fetched in ranged reads of ``BLOCK_BYTES`` (never the whole object)."""
        if mode != "rb":
            raise ValueError("remote traces are read only")
        return cast(BinaryIO, _Stream(self, self._call("open", self._fs().open, self._key, "rb", block_size=BLOCK_BYTES,
                                        cache_type="readahead")))

    def arrow(self) -> tuple[str, Any]:
        """(the object's key, its fsspec filesystem): where pyarrow reads and writes it (``filesystem=``)."""
        return self._key, self._fs()

    def write_bytes(self, data: bytes) -> None:
        """Put the object whole (one request: a reader sees the old object or the new one, never half)."""
        fs = self._fs()
        self._call("write", fs.pipe_file, self._key, data)

    def upload(self, local: Path) -> None:
        """Put a local file here, streamed from disk (multipart for a large one; readers never see half)."""
        fs = self._fs()
        self._call("upload", fs.put_file, str(local), self._key)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: an object store has no folders, only keys with slashes."""

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def read_bytes(self) -> bytes:
        with self.open() as fh:
            return fh.read()


def _with_account(key: str, account: str) -> str:
    """``container/path`` as the URL's part after ``://``: ``container@account.../path`` where an account is named."""
    if not account:
        return key
    container, _, rest = key.partition("/")
    return f"{container}@{account}/{rest}" if rest else f"{container}@{account}"


class _Stream:
    """An fsspec file whose read errors are ``OSError`` with the URL redacted (a connection dropped mid-scan)."""

    def __init__(self, path: RemotePath, fh: Any) -> None:
        self._path, self._fh = path, fh
        self.name = str(path)

    def read(self, n: int = -1) -> bytes:
        return bytes(self._path._call("read", self._fh.read, n))

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._path._call("seek", self._fh.seek, offset, whence))

    def tell(self) -> int:
        return int(self._fh.tell())

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._fh.close()

    @property
    def closed(self) -> bool:
        return bool(self._fh.closed)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: a URL inside some text: its scheme and host, then user info to drop (``user:pass@``) or a query (``?X-Amz-...``)
_USERINFO_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^/\s@]+)@([^/\s:?#]*)")
_QUERY_IN_TEXT = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)[?#][^\s]*")


def scrub(text: str) -> str:
    """``text`` with every URL in it redacted as ``redact_url`` does (a client's error message may quote one)."""
    return _QUERY_IN_TEXT.sub(r"\1", _USERINFO_IN_TEXT.sub(_drop_userinfo, text))


def _drop_userinfo(m: re.Match[str]) -> str:
    scheme, userinfo, host = m.groups()
    if ":" not in userinfo and _azure_container(scheme, userinfo, None, host):
        return m.group(0)  # an Azure container, not a credential
    return f"{scheme}://{host}"


def _first_line(exc: BaseException) -> str:
    return scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)[:300]


def remote_stat(info: dict[str, Any]) -> RemoteStat:
    """What a store's listing or ``info`` says of an object (S3's, GCS's and Azure's own field names), as a stat."""
    size = int(info.get("size") or 0)
    mtime = 0.0
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            mtime = float(value.timestamp())
            break
        if isinstance(value, (int, float)):
            mtime = float(value)
            break
        if isinstance(value, str):
            from datetime import datetime

            try:
                mtime = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
                break
            except ValueError:
                continue
    etag = info.get("ETag") or info.get("etag") or info.get("generation") or info.get("VersionId")
    version = str(etag).strip('"') if etag else f"{size}:{mtime}"
    return RemoteStat(size, mtime, version)


def version_of(path: Path | RemotePath) -> tuple[int, str]:
    """(size, version) of a file: what changes when its content does (mtime for a local file, the ETag in S3); for
    an object found by a listing, as that listing said (a watch lists often: one request, not one per object)."""
    if isinstance(path, RemotePath):
        remote = remote_stat(path.listed) if path.listed is not None else path.stat()
        return remote.st_size, remote.version
    st = path.stat()
    return st.st_size, str(st.st_mtime_ns)
