"""Asset values pickled under the instance's storage directory, one file per asset partition.

The layout is that of Dagster's default filesystem IO manager (`<storage>/<asset key>/<partition>`),
so values it stored stay loadable (a `reenrich` run loads raw_documents, extracted_images and
image_verdicts from there). What it leaves out is its debug log lines: three per input and one per
output, each a run event Dagster stores one SQLite write at a time (~40 events per ingest run).
The path a value went to is still in the output's metadata.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from urllib.parse import quote

import dagster as dg
from pydantic import PrivateAttr


class PickledAssetIOManager(dg.ConfigurableIOManager):
    """Pickle files under `base_dir`, by default the Dagster instance's storage directory."""

    base_dir: str | None = None
    _base: Path = PrivateAttr()

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._base = Path(self.base_dir or context.instance.storage_directory())

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        path = self._path(context)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write aside and rename: a reader (another run, a crashed write) never sees half a pickle.
        with tempfile.NamedTemporaryFile(
            "wb", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as file:
            pickle.dump(obj, file, pickle.HIGHEST_PROTOCOL)
        os.replace(file.name, path)
        if obj is not None:
            context.add_output_metadata({"path": dg.MetadataValue.path(str(path))})

    def load_input(self, context: dg.InputContext) -> object:
        path = self._path(context)
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: no stored value for {self._what(context)}; materialize it first"
            )
        with path.open("rb") as file:
            return pickle.load(file)

    def _path(self, context: dg.InputContext | dg.OutputContext) -> Path:
        if not context.has_asset_key:  # an op's output: per run and step, as Dagster's default does
            return self._base.joinpath(*context.get_identifier())
        path = self._base.joinpath(*context.asset_key.path)
        # Partition keys here are document-id slugs, which quote() leaves as they are.
        return path / quote(context.asset_partition_key, safe="") if context.has_asset_partitions else path

    @staticmethod
    def _what(context: dg.InputContext) -> str:
        if not context.has_asset_key:
            return f"input {context.name}"
        asset = context.asset_key.to_user_string()
        return f"{asset} partition {context.asset_partition_key}" if context.has_asset_partitions else asset
