"""The hashing O_DIRECT sink the manifest is written through."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from services.manifest.explode import BATCH_ROWS
from services.manifest.sink import ALIGN, HashingDirectSink
from services.manifest.write import write_ipc

PLACES = [Path("/dev/shm")] if Path("/dev/shm").is_dir() else []  # tmpfs: no O_DIRECT


@examples(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.lists(st.integers(min_value=0, max_value=5 * ALIGN + 7), max_size=30))
def test_the_file_and_its_sha256_are_exactly_the_bytes_written(
    tmp_path: Path, sizes: list[int]
) -> None:
    rng = random.Random(len(sizes))
    chunks = [rng.randbytes(n) for n in sizes]
    expected = b"".join(chunks)
    for directory in [tmp_path, *PLACES]:
        path = directory / f"egoline-sink-test-{os.getpid()}.bin"
        try:
            with HashingDirectSink(path, block=2 * ALIGN, ring=2) as sink:
                for chunk in chunks:
                    assert sink.write(chunk) == len(chunk)
                assert sink.tell() == len(expected)
            assert path.read_bytes() == expected
            assert sink.sha256() == hashlib.sha256(expected).hexdigest()
        finally:
            path.unlink(missing_ok=True)


def test_sha256_is_refused_before_the_file_is_complete(tmp_path: Path) -> None:
    sink = HashingDirectSink(tmp_path / "x.bin", block=ALIGN, ring=2)
    sink.write(b"abc")
    with pytest.raises(RuntimeError, match="before close"):
        sink.sha256()
    sink.close()
    assert (tmp_path / "x.bin").read_bytes() == b"abc"


def test_an_ipc_file_through_the_sink_is_the_one_pyarrow_writes_itself(tmp_path: Path) -> None:
    rows = BATCH_ROWS + 12345  # two record batches, the second short
    values = pa.array(np.arange(rows, dtype=np.int64))
    names = pa.DictionaryArray.from_arrays(
        pa.array(np.arange(rows, dtype=np.int32) % 3), pa.array(["a", "b", "c"])
    )
    table = pa.table({"n": values, "name": names}).replace_schema_metadata({b"k": b"v"})
    reference = tmp_path / "reference.arrow"
    with pa.OSFile(str(reference), "wb") as out, ipc.new_file(out, table.schema) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    digest = write_ipc(table, tmp_path / "sink.arrow")
    assert (tmp_path / "sink.arrow").read_bytes() == reference.read_bytes()
    assert digest == hashlib.sha256(reference.read_bytes()).hexdigest()
    assert ipc.open_file(pa.memory_map(str(tmp_path / "sink.arrow"))).read_all().equals(table)
