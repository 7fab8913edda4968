"""ferry.save_safetensors when it cannot or must not finish: destinations that are not files
(an error naming the destination and what is wrong, nothing created), Ctrl-C during a save (the
partial file removed, KeyboardInterrupt raised, the old file kept), and sharded checkpoints
saved into a folder and loaded back."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry


def test_destinations_that_are_not_files(tmp_path):
    t = {"w": np.ones(1024, np.float32)}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ferry.CheckpointError) as e:
        ferry.save_safetensors(t, fifo)
    assert "fifo" in str(e.value) and "FIFO" in str(e.value)
    if os.path.exists("/proc/version"):
        with pytest.raises(OSError) as e:
            ferry.save_safetensors(t, "/proc/version")
        msg = str(e.value)
        assert "/proc/version" in msg and "cannot create the temporary file" in msg, msg
        assert "write of 0 bytes" not in msg
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_ctrl_c_during_a_save_leaves_nothing(tmp_path):
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"old")
    script = textwrap.dedent(
        f"""
        import signal, numpy as np, ferry
        # Ctrl-C raises KeyboardInterrupt even where this ran from a shell's background job
        # (which starts its children with SIGINT ignored, and Python then keeps it so).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        w = np.ones(1 << 28, np.float32)  # 1 GiB
        try:
            for _ in range(20):
                ferry.save_safetensors({{"w": w}}, {str(out)!r})
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise SystemExit(7)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    t0 = time.time()
    while time.time() - t0 < 60:
        if any(".ferry-partial-" in n for n in os.listdir(tmp_path)):
            break
        assert p.poll() is None, "the save ended before it was seen"
        time.sleep(0.001)
    p.send_signal(signal.SIGINT)
    stdout, _ = p.communicate(timeout=60)
    assert p.returncode == 7, stdout
    assert b"interrupted" in stdout
    assert [n for n in os.listdir(tmp_path) if ".ferry-partial-" in n] == []
    # Interrupted in its first save: the old bytes stay; in a later one: a complete file.
    size = out.stat().st_size
    assert size == 3 or size > (1 << 30), size


def test_a_sharded_save_into_a_folder_loads_back(tmp_path):
    rng = np.random.default_rng(1)
    t = {f"layer.{i}.w": rng.standard_normal(1024 << (i % 6), dtype=np.float32) for i in range(30)}
    ferry.save_safetensors(t, tmp_path, metadata={"format": "np"}, max_shard_size=1 << 20)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0].endswith(f"-of-{len(shards):05}.safetensors")
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in t.values())
    back = ferry.load_safetensors(
        tmp_path / "model.safetensors.index.json", device="cpu", framework="numpy"
    )
    assert back.keys() == t.keys()
    for k, v in t.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)
    with pytest.raises(ferry.ArgumentError):
        ferry.save_safetensors(t, tmp_path, max_shard_size=0)


def test_non_blocking_saves_what_the_arrays_held(tmp_path):
    a = np.full(3 << 20, 5, np.uint8)
    req = ferry.save_safetensors({"a": a}, tmp_path / "s.safetensors", non_blocking=True)
    assert isinstance(req, ferry.SaveRequest)
    a[:] = 9  # the arrays may change once the request is returned
    r = req.wait()
    assert req.done()
    assert req.wait() is r  # a later wait() returns the same report
    assert (r.tensors, r.bytes) == (1, (tmp_path / "s.safetensors").stat().st_size)
    assert r.snapshot_bytes >= a.nbytes and r.seconds > 0
    back = ferry.load_safetensors(tmp_path / "s.safetensors", device="cpu", framework="numpy")
    assert (back["a"] == 5).all()
    # An error comes back on wait().
    req = ferry.save_safetensors({"a": a}, tmp_path / "no" / "x.safetensors", non_blocking=True)
    with pytest.raises(OSError):
        req.wait()
    with pytest.raises(OSError):  # raised again by a later wait()
        req.wait()
    assert req.done()
    r = ferry.save_safetensors({"a": a}, tmp_path / "t.safetensors")
    assert isinstance(r, ferry.SaveReport)
    assert (r.tensors, r.files, r.writer) == (1, 1, "buffered")  # under 64 MiB: buffered
    assert r.bytes == (tmp_path / "t.safetensors").stat().st_size


def test_a_background_save_waited_from_two_threads_gives_both_its_report(tmp_path):
    import threading

    t = {f"w{i}": np.full(1 << 18, i, np.float32) for i in range(8)}
    req = ferry.save_safetensors(t, tmp_path / "two.safetensors", non_blocking=True)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(req.wait())) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(got) == 2 and got[0] is got[1], got
    assert got[0].bytes == (tmp_path / "two.safetensors").stat().st_size
    assert req.done()


def test_non_blocking_within_a_memory_bound_writes_the_same_file(tmp_path):
    t = {f"w{i}": np.arange(i * 5000, (i + 1) * 5000, dtype=np.float32) for i in range(12)}
    ferry.save_safetensors(t, tmp_path / "ref.safetensors")
    # 240 kB of tensors through a 64 KiB snapshot: streamed, the same bytes.
    req = ferry.save_safetensors(
        t, tmp_path / "s.safetensors", non_blocking=True, snapshot_bytes=64 << 10
    )
    assert isinstance(req, ferry.SaveRequest)
    for a in t.values():
        a[:] = -1  # the arrays may change once the request is returned
    req.wait()
    assert (tmp_path / "s.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    with pytest.raises(ferry.ArgumentError, match="snapshot_bytes"):
        ferry.save_safetensors(t, tmp_path / "x.safetensors", non_blocking=True, snapshot_bytes=0)


def test_kept_snapshot_memory_serves_saves_in_a_loop(tmp_path):
    t = {f"w{i}": np.full(30000, i, dtype=np.float32) for i in range(8)}
    ferry.save_safetensors(t, tmp_path / "ref.safetensors")
    want = (tmp_path / "ref.safetensors").read_bytes()
    for step in range(3):  # a training loop's saves: the memory kept by one serves the next
        req = ferry.save_safetensors(t, tmp_path / "k.safetensors", non_blocking=True, keep_snapshot=True)
        assert req is not None
        req.wait()
        assert (tmp_path / "k.safetensors").read_bytes() == want, step
    # Without it, the kept memory is freed; the save is the same.
    req = ferry.save_safetensors(t, tmp_path / "f.safetensors", non_blocking=True)
    assert req is not None
    req.wait()
    assert (tmp_path / "f.safetensors").read_bytes() == want
    with pytest.raises(ferry.ArgumentError, match="keep_snapshot"):
        ferry.save_safetensors(t, tmp_path / "x.safetensors", non_blocking=True, keep_snapshot="yes")
    with pytest.raises(ferry.ArgumentError, match="non_blocking=True"):
        ferry.save_safetensors(t, tmp_path / "x.safetensors", keep_snapshot=True)
    assert not (tmp_path / "x.safetensors").exists()


def test_every_writer_writes_the_same_file(tmp_path):
    t = {f"w{i}": np.arange(i * 70001, (i + 1) * 70001, dtype=np.float32) for i in range(5)}
    ferry.save_safetensors(t, tmp_path / "ref.safetensors", writer="buffered")
    want = (tmp_path / "ref.safetensors").read_bytes()
    for writer in ["direct", "hybrid", "auto"]:
        for fsync in [False, True]:
            p = tmp_path / f"{writer}-{fsync}.safetensors"
            r = ferry.save_safetensors(t, p, writer=writer, fsync=fsync)
            assert p.read_bytes() == want
            assert r.synced == fsync and r.direct_bytes + r.buffered_bytes == r.bytes == len(want)
            # What ran: the one asked for (O_DIRECT falls back to buffered only where the file
            # system refuses it, said in the note), or auto's choice for 1.4 MB: buffered.
            if writer == "auto":
                assert r.writer == "buffered", r
            elif r.writer != writer:
                assert r.writer == "buffered" and "O_DIRECT" in r.writer_note, r
            assert writer in repr(r) or r.writer in repr(r)
            assert "tensors in 1 file(s)" in str(r)
            req = ferry.save_safetensors(
                t, p, writer=writer, fsync=fsync, non_blocking=True, snapshot_bytes=256 << 10
            )
            assert req is not None
            req.wait()
            assert p.read_bytes() == want
    with pytest.raises(ferry.ArgumentError, match="writer"):
        ferry.save_safetensors(t, tmp_path / "x.safetensors", writer="fast")
    assert not (tmp_path / "x.safetensors").exists()
