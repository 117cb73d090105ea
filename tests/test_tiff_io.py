"""Streamed OME-TIFF writing and region reading: what lets deconvolve/edf/stitch keep host memory
to one chunk instead of whole stacks, without giving up atomic writes or reproducible bytes."""

import numpy as np
import pytest
import tifffile

from plexgpu.image import deconvolution as dc
from plexgpu.io.tiff import StackReader, TiffReadError, ome_writer, read_tiff, write_ome


def test_region_writes_equal_one_write(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.random((3, 70, 90), dtype=np.float32)
    write_ome(tmp_path / "whole.ome.tif", data, "ZYX", 0.377, 1.5, ["CD3"])
    with ome_writer(tmp_path / "parts.ome.tif", data.shape, np.float32, "ZYX", 0.377, 1.5, ["CD3"]) as out:
        for ys in (slice(0, 40), slice(40, 70)):
            for xs in (slice(0, 50), slice(50, 90)):
                out[:, ys, xs] = data[:, ys, xs]
        assert not (tmp_path / "parts.ome.tif").exists()          # not in place until complete
    # same name and pixels -> same bytes (the UUID is derived from the content)
    (tmp_path / "again").mkdir()
    write_ome(tmp_path / "again/parts.ome.tif", data, "ZYX", 0.377, 1.5, ["CD3"])
    assert (tmp_path / "parts.ome.tif").read_bytes() == (tmp_path / "again/parts.ome.tif").read_bytes()
    with tifffile.TiffFile(tmp_path / "parts.ome.tif") as tif:
        assert tif.is_ome and tif.series[0].axes == "ZYX"
        assert "00000000-0000-0000-0000-000000000000" not in tif.pages.first.description
        np.testing.assert_array_equal(tif.asarray(), data)
    changed = data.copy()
    changed[1, 2, 3] += 1
    write_ome(tmp_path / "again/parts.ome.tif", changed, "ZYX", 0.377, 1.5, ["CD3"])
    with tifffile.TiffFile(tmp_path / "again/parts.ome.tif") as a, tifffile.TiffFile(tmp_path / "parts.ome.tif") as b:
        assert a.ome_metadata != b.ome_metadata                        # other pixels, other UUID


def test_failed_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ome_writer(tmp_path / "x.ome.tif", (2, 8, 8), np.uint16, "ZYX") as out:
            out[0] = 1
            raise RuntimeError("job killed")
    assert list(tmp_path.iterdir()) == []


def test_reader_regions_and_compressed_fallback(tmp_path):
    data = np.arange(4 * 30 * 40, dtype=np.uint16).reshape(4, 30, 40)
    write_ome(tmp_path / "a.ome.tif", data, "ZYX")
    tifffile.imwrite(tmp_path / "b.tif", data, compression="zlib", photometric="minisblack")
    for name in ("a.ome.tif", "b.tif"):
        r = StackReader(tmp_path / name)
        assert r.shape == data.shape and r.dtype == np.uint16
        np.testing.assert_array_equal(r[:, 5:17, 9:33], data[:, 5:17, 9:33])
        np.testing.assert_array_equal(r[2], data[2])
    assert StackReader(tmp_path / "a.ome.tif")._pages is not None    # tile by tile, not read whole
    (tmp_path / "bad.tif").write_bytes(b"II*\x00garbage")
    with pytest.raises(TiffReadError, match="bad.tif"):
        StackReader(tmp_path / "bad.tif")


def test_chunks_split_evenly_and_fit_the_budget():
    for size, chunk in ((3381, 2048), (100, 100), (101, 50), (7, 64)):
        sl = dc.chunk_slices(size, chunk, 5)
        written = [w for _, w, _ in sl]
        assert written[0].start == 0 and written[-1].stop == size
        assert all(a.stop == b.start for a, b in zip(written, written[1:]))
        lengths = [w.stop - w.start for w in written]
        assert max(lengths) <= chunk and max(lengths) - min(lengths) <= 1
    psf_shape = (15, 77, 77)
    shape = (8, 3381, 2665)
    budget = 4.0 * np.prod(shape)
    chunk = dc.chunk_for_budget(shape, psf_shape, budget, 2048)
    piece = dc.piece_shape(shape, chunk, dc.default_halo(psf_shape))
    assert piece[1] > chunk and piece[1] <= chunk + 2 * dc.default_halo(psf_shape)
    assert dc.working_bytes(piece, psf_shape) <= budget                   # fits ...
    bigger = (8, int(piece[1] * 1.25), int(piece[2] * 1.25))
    assert dc.working_bytes(bigger, psf_shape) > budget                   # ... and is not needlessly small
    assert dc.chunk_for_budget(shape, psf_shape, 1e15, 2048) == 2048      # the configured maximum holds


def test_streamed_deconvolution_equals_in_memory(tmp_path):
    rng = np.random.default_rng(1)
    stack = (rng.random((5, 96, 80)) * 1000).astype(np.uint16)
    psf = np.ones((3, 5, 5), np.float32) / 75
    write_ome(tmp_path / "in.ome.tif", stack, "ZYX")
    expected = dc.deconvolve(stack.astype(np.float32), psf, 4, chunk_px=40)
    flux: dict = {}
    with ome_writer(tmp_path / "out.ome.tif", stack.shape, np.float32, "ZYX") as out:
        dc.deconvolve(StackReader(tmp_path / "in.ome.tif"), psf, 4, chunk_px=40, out=out, flux=flux)
    np.testing.assert_array_equal(read_tiff(tmp_path / "out.ome.tif"), expected)
    # flux totals gathered chunk by chunk as they pass equal those of the whole stacks
    assert flux["in"] == pytest.approx(float(stack.sum(dtype=np.float64)), rel=1e-9)
    assert flux["out"] == pytest.approx(float(expected.sum(dtype=np.float64)), rel=1e-6)


def test_pyramid_streamed_plane_by_plane(tmp_path):
    from plexgpu.io.tiff import write_pyramidal_ome

    rng = np.random.default_rng(2)
    planes = [rng.random((600, 520), dtype=np.float32) for _ in range(3)]
    calls = []

    def read(c):
        calls.append(c)
        return planes[c]

    levels = write_pyramidal_ome(tmp_path / "plex.ome.tif", read, 3, ["DAPI", "CD3", "CD8"], 0.377)
    assert levels == 3 and calls == [0, 1, 2]                         # each plane read once
    with tifffile.TiffFile(tmp_path / "plex.ome.tif") as tif:
        s = tif.series[0]
        np.testing.assert_array_equal(s.asarray(), np.stack(planes))
        half = np.stack(planes)[:, :600, :520].reshape(3, 300, 2, 260, 2).mean(axis=(2, 4))
        np.testing.assert_allclose(s.levels[1].asarray(), half, rtol=1e-6)
        assert s.levels[2].shape == (3, 150, 130)
        assert 'Name="CD8"' in tif.ome_metadata and "00000000-0000" not in tif.ome_metadata
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plex.ome.tif"]   # no scratch, no part file
    (tmp_path / "b").mkdir()
    write_pyramidal_ome(tmp_path / "b/plex.ome.tif", lambda c: planes[c], 3, ["DAPI", "CD3", "CD8"], 0.377)
    assert (tmp_path / "b/plex.ome.tif").read_bytes() == (tmp_path / "plex.ome.tif").read_bytes()
    with pytest.raises(ValueError, match="plane 1"):
        write_pyramidal_ome(tmp_path / "c.ome.tif", lambda c: planes[c][:10 if c else None], 2, ["a", "b"], 0.377)
    assert not (tmp_path / "c.ome.tif").exists() and not list(tmp_path.glob(".*"))


def test_part_file_of_a_killed_attempt_is_removed(tmp_path):
    stale = tmp_path / ".CH1.ome.tif.k3j2h1.part"           # what a SIGKILLed writer leaves
    stale.write_bytes(b"\0" * 1000)
    scratch = tmp_path / ".CH1.ome.tif.q9w8e7.part"         # a killed pyramid writer's scratch folder
    scratch.mkdir()
    (scratch / "level1.raw").write_bytes(b"\0" * 10)
    other = tmp_path / ".CH2.ome.tif.a1b2c3.part"           # another output's: not touched
    other.write_bytes(b"\0")
    write_ome(tmp_path / "CH1.ome.tif", np.zeros((3, 4, 4), np.float32), "ZYX")
    assert not stale.exists() and not scratch.exists() and other.exists() and (tmp_path / "CH1.ome.tif").exists()


def test_outputs_get_the_umask_permissions_and_resolution_tags(tmp_path):
    """0644 under umask 022 (mkstemp alone gave 0600: colleagues could not open results), and TIFF
    resolution tags that say the pixel size to readers that skip OME-XML."""
    import os
    import stat

    import tifffile

    from plexgpu.io.tiff import FILE_MODE, write_ome, write_pyramidal_ome, write_text_atomic

    old = os.umask(0o022)
    os.umask(old)
    assert FILE_MODE == 0o666 & ~old
    write_ome(tmp_path / "a.ome.tif", np.zeros((2, 32, 32), np.uint16), "ZYX", 0.5)
    write_text_atomic(tmp_path / "b.csv", "x\n")
    write_pyramidal_ome(tmp_path / "p.ome.tif", lambda c: np.zeros((300, 300), np.uint16), 2, ["a", "b"], 0.5)
    for name in ("a.ome.tif", "b.csv", "p.ome.tif"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == FILE_MODE
    with tifffile.TiffFile(tmp_path / "a.ome.tif") as tif:
        page = tif.pages.first
        assert page.tags["ResolutionUnit"].value == 3                      # centimetre
        num, den = page.tags["XResolution"].value
        assert abs(num / den - 2e4) < 1                                    # 0.5 um -> 20000 px/cm


def test_plex_channel_names_unique_and_markers_csv():
    from plexgpu.stages import markers_csv, unique_channel_names

    names = ["DAPI", "CD3", "DAPI", "CD20", "DAPI", "CD20"]
    cycles = [1, 1, 2, 2, 3, 3]
    unique = unique_channel_names(names, cycles)
    assert unique == ["DAPI", "CD3", "DAPI_cyc002", "CD20", "DAPI_cyc003", "CD20_cyc003"]
    lines = markers_csv(unique, cycles).splitlines()
    assert lines[0] == "channel_number,cycle_number,marker_name" and lines[3] == "3,2,DAPI_cyc002"


def test_plex_uint16_deflate_tiled_and_readable(tmp_path):
    import tifffile

    from plexgpu.io.tiff import write_pyramidal_ome

    rng = np.random.default_rng(0)
    planes = [np.abs(rng.normal(300, 50, (1100, 1300))).astype(np.float32) for _ in range(2)]
    write_pyramidal_ome(tmp_path / "f.ome.tif", lambda c: planes[c], 2, ["a", "b"], 0.377, compression=None)
    write_pyramidal_ome(tmp_path / "u.ome.tif", lambda c: planes[c], 2, ["a", "b"], 0.377, dtype="uint16")
    with tifffile.TiffFile(tmp_path / "u.ome.tif") as tif:
        page = tif.series[0].levels[0].pages[0]
        assert page.dtype == np.uint16 and page.compression == 8 and page.tilewidth == 512   # Adobe Deflate
        data = tif.series[0].asarray()
    assert np.array_equal(data[1], np.clip(np.rint(planes[1]), 0, 65535).astype(np.uint16))
    ratio = (tmp_path / "u.ome.tif").stat().st_size / (tmp_path / "f.ome.tif").stat().st_size
    print(f"uint16 + deflate / float32 uncompressed: {ratio:.2f}")
    assert ratio < 0.5


def test_pyramid_writer_holds_one_plane_whatever_the_channel_count(tmp_path):
    """tracemalloc over the whole write of 8 float32 channels to uint16: the peak is about one plane
    as read plus one in the file's dtype plus tiles and halved levels (1.9 float32 planes measured; 3.0
    before the writer dropped each plane before reading the next), not the multiplex (8 planes)."""
    import tracemalloc

    from plexgpu.io.tiff import write_pyramidal_ome

    shape = (1024, 1536)
    plane_bytes = shape[0] * shape[1] * 4

    def read_plane(c):                        # a fresh float32 plane per call, as read from disk
        return np.full(shape, 100.0 + c, np.float32)

    tracemalloc.start()
    try:
        write_pyramidal_ome(tmp_path / "plex.ome.tif", read_plane, 8, [f"c{c}" for c in range(8)], 0.5,
                            dtype="uint16")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"peak {peak / plane_bytes:.2f} float32 planes")
    assert peak < 2.25 * plane_bytes, f"peak {peak / plane_bytes:.2f} planes"
    back = read_tiff(tmp_path / "plex.ome.tif")
    assert back.shape == (8,) + shape and back.dtype == np.uint16 and int(back[7, 5, 5]) == 107


def test_stacks_tiled_deflate_and_read_region_by_region(tmp_path):
    """Per-stage stacks (stitched, deconvolved) are written as the plex file is: 512-px tiles, Deflate
    (predictor for integers), resolution tags. The next stage reads a region by decoding only the tiles
    it touches (a deconvolution chunk, an EDF plane), so the stacks never have to fit in memory."""
    rng = np.random.default_rng(4)
    counts = rng.poisson(300, (3, 1100, 1300)).astype(np.uint16)
    floats = (counts * 0.731).astype(np.float32)
    for name, data in (("u.ome.tif", counts), ("f.ome.tif", floats)):
        with ome_writer(tmp_path / name, data.shape, data.dtype, "ZYX", 0.5, 1.5, ["CD3"], workers=3) as out:
            out[:, 100:, :] = data[:, 100:, :]                   # regions in any order
            out[:, :100, :] = data[:, :100, :]
        with tifffile.TiffFile(tmp_path / name) as tif:
            page = tif.pages.first
            assert page.compression == 8 and (page.tilelength, page.tilewidth) == (512, 512)
            assert page.predictor == (2 if data.dtype == np.uint16 else 1)
            assert page.tags["ResolutionUnit"].value == 3
            np.testing.assert_array_equal(tif.asarray(), data)
        for workers in (1, 4):
            r = StackReader(tmp_path / name, workers=workers)
            assert r._pages is not None and r.shape == data.shape and r.dtype == data.dtype
            for index in [(slice(None), slice(500, 530), slice(1000, 1300)), (1,), (2, -1), (0, 511, slice(510, 514)),
                          (slice(1, 3), slice(0, 1100), slice(7, 8)), (slice(None), slice(1090, 2000)),
                          (slice(0, 0),), (-1, slice(None), 1299)]:
                np.testing.assert_array_equal(r[index], data[index])
    with pytest.raises(IndexError):
        StackReader(tmp_path / "u.ome.tif")[:, ::2]
    # only the tiles a region touches are decoded: a 30x300 window across one tile edge -> 2 tiles per plane
    r = StackReader(tmp_path / "u.ome.tif")
    decoded = []
    for page in r._pages:
        page.decode = (lambda f: lambda blob, t, **kw: (decoded.append(t), f(blob, t, **kw))[1])(page.decode)
    r[:, 100:130, 400:700]
    assert len(decoded) == 3 * 2
    ratio = (tmp_path / "u.ome.tif").stat().st_size / counts.nbytes
    print(f"uint16 Poisson stack, Deflate level 1 + predictor: {ratio:.2f} of uncompressed")
    assert ratio < 0.8
