"""The model store and the data service: what a fetch of a job's references yields.

`huggingface` and `uri` references are served from a model store folder; `scheduler`
references get the next data slice as Hypha's slice tracker (upstream `tracker/slice.rs`)
hands them out: each worker keeps the slices it had before, so when the data set comes
round again the same index goes to the same worker, and the worker's bridge rewrites
`artifacts/<index>` in place.

An action-era data node (`compressed=True`) serves each slice as one raw Snappy block of
its safetensors file under the name `<hash>`: the first 8 bytes of the BLAKE3 hash of the
served bytes, as a little-endian u64 (crates/data/src/hash.rs), in decimal.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from hypha.standin.data_service.assets import Assets
from hypha.standin.errors import CoordinatorRefusal


@dataclass(frozen=True)
class Catalog:
    """What the coordinator serves: the model store and one data set of slices."""

    models_dir: Path
    dataset_dir: Path
    dataset_name: str
    model_repository: str
    model_filenames: tuple[str, ...]
    preprocessor_filenames: tuple[str, ...] = ()

    @classmethod
    def from_assets(cls, assets: Assets) -> Catalog:
        spec = assets.spec
        return cls(
            assets.models_dir,
            assets.dataset_dir,
            spec.dataset_name,
            spec.model_repository,
            spec.model_filenames,
            spec.preprocessor_filenames,
        )


@dataclass
class _Slice:
    index: int
    peer: str | None = None
    processed: bool = False


class SliceTracker:
    """Hands out slice indices per peer: first an open slice no other peer had, else one
    of the peer with the fewest open slices left (stolen), else a new pass over the data
    set in which every peer gets its own slices again."""

    def __init__(self, indices: list[int]) -> None:
        self._slices = [_Slice(index) for index in indices]
        self.passes = 0

    def next(self, peer: str) -> int:
        while True:
            own = self._first_open(peer)
            if own is not None:
                return self._take(own, peer)
            owners = [s.peer for s in self._slices if not s.processed]
            if owners:
                victim = min(dict.fromkeys(owners), key=owners.count)
                stolen = self._first_open(victim)
                assert stolen is not None
                return self._take(stolen, peer)
            self.passes += 1
            for item in self._slices:
                item.processed = False

    def forget(self, peer: str) -> None:
        """A peer that left: its slices are anyone's again."""
        for item in self._slices:
            if item.peer == peer:
                item.peer = None

    def _first_open(self, peer: str | None) -> _Slice | None:
        return next((s for s in self._slices if not s.processed and s.peer in (None, peer)), None)

    @staticmethod
    def _take(item: _Slice, peer: str) -> int:
        item.processed, item.peer = True, peer
        return item.index


class DataService:
    """Resolves a reference into named files, each behind an opaque blob id. Not
    thread-safe: the coordinator calls it under its lock."""

    def __init__(self, catalog: Catalog, scheduler_peer: str, compressed: bool = False) -> None:
        self.catalog = catalog
        self.scheduler_peer = scheduler_peer
        self.compressed = compressed
        self._hashed: dict[int, tuple[str, Path]] = {}  # index -> hash name, compressed file
        indices = sorted(
            int(path.stem)
            for path in catalog.dataset_dir.glob("*.safetensors")
            if path.stem.isdigit()
        )
        if not indices:
            raise ValueError(f"no <index>.safetensors slices in {catalog.dataset_dir}")
        self.slices = SliceTracker(indices)
        self._blobs: dict[str, Path] = {}

    def fetch(
        self, peer: str, reference: dict[str, Any]
    ) -> tuple[list[dict[str, str]], int | None]:
        """The files as {"name", "blob"}, and the slice index when a slice was handed out."""
        kind = reference.get("type")
        catalog = self.catalog
        if kind == "scheduler":
            if reference.get("peer") != self.scheduler_peer:
                raise CoordinatorRefusal(
                    502, "network_error", f"no scheduler at peer {reference.get('peer')}"
                )
            if reference.get("dataset") != catalog.dataset_name:
                raise CoordinatorRefusal(
                    404,
                    "connector_error",
                    f"the scheduler has no data set {reference.get('dataset')!r}",
                )
            index = self.slices.next(peer)
            path = catalog.dataset_dir / f"{index}.safetensors"
            if self.compressed:
                name, path = self._compressed(index, path)
                return [self._blob(name, path)], index
            return [self._blob(str(index), path)], index
        if kind == "huggingface":
            name = str(reference.get("repository"))
            repository = _inside(catalog.models_dir, name)
            return [
                self._blob(file, _inside(repository, file), f"{name} has no file {file}")
                for file in reference.get("filenames") or []
            ], None
        if kind == "uri":
            file = urlsplit(str(reference.get("value"))).path.rsplit("/", 1)[-1]
            path = _inside(catalog.models_dir / "uri", unquote(file))
            return [self._blob(file, path, f"nothing is served at {reference.get('value')}")], None
        raise CoordinatorRefusal(400, "invalid_request", f"cannot fetch a {kind} reference")

    def _compressed(self, index: int, path: Path) -> tuple[str, Path]:
        """The slice as an action-era data node serves it (made once, beside the data set)."""
        if index not in self._hashed:
            import blake3
            import cramjam

            try:
                data = bytes(cramjam.snappy.compress_raw(path.read_bytes()))
            except OSError:
                raise CoordinatorRefusal(
                    404, "connector_error", f"{path.name} is missing"
                ) from None
            name = str(int.from_bytes(blake3.blake3(data).digest()[:8], "little"))
            folder = self.catalog.dataset_dir.with_name(self.catalog.dataset_dir.name + "-snappy")
            folder.mkdir(exist_ok=True)
            (folder / name).write_bytes(data)
            self._hashed[index] = (name, folder / name)
        return self._hashed[index]

    def blob_path(self, blob: str) -> Path:
        path = self._blobs.get(blob)
        if path is None:
            raise CoordinatorRefusal(404, "connector_error", f"no blob {blob}")
        return path

    def _blob(self, name: str, path: Path, missing: str = "") -> dict[str, str]:
        if not path.is_file():
            raise CoordinatorRefusal(404, "connector_error", missing or f"{path.name} is missing")
        blob = secrets.token_hex(8)
        self._blobs[blob] = path
        return {"name": name, "blob": blob}


def _inside(root: Path, relative: str) -> Path:
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts:
        raise CoordinatorRefusal(404, "connector_error", f"no such item {relative!r}")
    return root / pure
