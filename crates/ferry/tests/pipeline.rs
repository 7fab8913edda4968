//! The pipeline on the CPU engine: outputs identical to a sequential reference for random
//! chunk sizes and K = 1..4, ragged, short and empty sources, strided sources, failing and
//! panicking stages (nothing leaked, engine usable), two pipelines on one engine, timelines.

mod threads_common;
use ferry::pipeline::{
    Chunk, CpuPipeline, Dest, OutLen, Phase, PipelineConfig, PipelineError, Source,
};
use ferry::{CpuEngine, Engine, EngineExt, Layout};
use std::sync::Mutex;
use threads_common::threads_now;

/// Leak checks count the process's `ferry-*` threads: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| (r.next() >> 24) as u8).collect()
}

/// The stage every test runs: each output byte from the input and the chunk's number; a
/// fixed-size output is a checksum of the chunk.
fn stage(c: &Chunk, input: &[u8], out: &mut [u8]) {
    assert_eq!(input.len(), c.len);
    if out.len() == 8 && c.len != 8 {
        let sum: u64 = input.iter().map(|&b| u64::from(b)).sum::<u64>() + c.index as u64;
        out.copy_from_slice(&sum.to_le_bytes());
        return;
    }
    for (j, o) in out.iter_mut().enumerate() {
        let i = input[j % input.len()];
        *o = i.wrapping_mul(3).wrapping_add(c.index as u8) ^ (j as u8);
    }
}

/// The same stage, one chunk after the other, on plain slices.
fn reference(src: &[u8], chunk: usize, out: OutLen) -> Vec<u8> {
    let mut res = Vec::new();
    for (index, input) in src.chunks(chunk).enumerate() {
        let c = Chunk {
            index,
            offset: index * chunk,
            len: input.len(),
            out_offset: res.len(),
            out_len: out.of(input.len()),
        };
        let mut o = vec![0u8; c.out_len];
        stage(&c, input, &mut o);
        res.extend_from_slice(&o);
    }
    res
}

fn run_once(
    engine: &CpuEngine,
    src: &[u8],
    chunk: usize,
    k: usize,
    out: OutLen,
) -> Result<Vec<u8>, PipelineError> {
    let want = reference(src, chunk, out);
    let mut dst = vec![0xAAu8; want.len() + 3];
    let mut p = CpuPipeline::new(engine, PipelineConfig::new(chunk, k).output(out))?;
    let rep = p.run(Source::new(src), Some(Dest::new(&mut dst)), |c, i, o| {
        stage(c, i, o);
        Ok::<(), std::convert::Infallible>(())
    })?;
    assert_eq!(rep.chunks, src.len().div_ceil(chunk));
    assert_eq!(rep.bytes_out as usize, want.len());
    assert_eq!(&dst[want.len()..], &[0xAA; 3], "wrote past the outputs");
    dst.truncate(want.len());
    assert!(dst == want, "output differs from the sequential reference");
    Ok(dst)
}

#[test]
fn matches_sequential_reference_for_random_chunks_and_every_k() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let mut r = Rng(0x5EED);
    for round in 0..24 {
        let n = 1 + r.below(300_000);
        let chunk = 1 + r.below(70_000);
        let k = 1 + round % 4;
        let out = match r.below(3) {
            0 => OutLen::Same,
            1 => OutLen::Fixed(8),
            _ => OutLen::Ratio { num: 1, den: 2 },
        };
        let src = bytes(n, round as u64);
        run_once(&engine, &src, chunk, k, out)
            .unwrap_or_else(|e| panic!("n {n} chunk {chunk} k {k} {out:?}: {e}"));
    }
}

#[test]
fn ragged_short_and_empty_sources() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    for k in 1..=4 {
        // Ragged last chunk.
        run_once(&engine, &bytes(10_000 + 17, 1), 1000, k, OutLen::Same).unwrap();
        // Shorter than one chunk.
        run_once(&engine, &bytes(123, 2), 4096, k, OutLen::Same).unwrap();
        // One byte.
        run_once(&engine, &bytes(1, 3), 4096, k, OutLen::Fixed(8)).unwrap();
    }
    // Empty: no chunk, the stage never runs, the destination is untouched.
    let mut p = CpuPipeline::new(&engine, PipelineConfig::new(64, 2)).unwrap();
    let mut dst = vec![9u8; 4];
    let rep = p
        .run(
            Source::new(&[0u8; 0][..]),
            Some(Dest::new(&mut dst)),
            |_, _, _| Err::<(), _>("the stage must not run on an empty source"),
        )
        .unwrap();
    assert_eq!((rep.chunks, rep.bytes_in, rep.bytes_out), (0, 0, 0));
    assert_eq!(dst, [9; 4]);
}

#[test]
fn without_destination_the_stage_sees_every_chunk() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let src = bytes(50_001, 4);
    let mut p = CpuPipeline::new(&engine, PipelineConfig::new(4096, 3)).unwrap();
    let mut seen = Vec::new();
    p.run(Source::new(&src), None, |c, input, out| {
        assert!(out.is_empty());
        seen.extend_from_slice(input);
        assert_eq!(c.offset + c.len, seen.len());
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    assert!(seen == src);
}

#[test]
fn strided_source_is_read_in_layout_order() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    // Columns 3..61 of a 200 x 64 matrix of u32, read through a strided layout.
    let m: Vec<u32> = (0..200 * 64).map(|i| i as u32 * 7 + 1).collect();
    let l = Layout::contiguous(&[200, 64], 4)
        .unwrap()
        .slice(1, 3..61, 1)
        .unwrap();
    let dense: Vec<u8> = (0..200)
        .flat_map(|r| (3..61).map(move |c| (r * 64 + c) as u32))
        .map(|i| i * 7 + 1)
        .flat_map(u32::to_le_bytes)
        .collect();
    for (k, chunk) in [(1, 1000), (2, 232 * 3), (3, 5000), (4, 1)] {
        let row = 58 * 4;
        let step = (chunk / row).max(1) * row;
        let want = reference(&dense, step, OutLen::Same);
        let mut dst = vec![0u8; want.len()];
        let mut p = CpuPipeline::new(&engine, PipelineConfig::new(chunk.max(row), k)).unwrap();
        let src = Source::strided(&m, l).unwrap();
        assert_eq!(src.len(), dense.len());
        p.run(src, Some(Dest::new(&mut dst)), |c, i, o| {
            assert_eq!(c.len % row, 0, "chunks are whole rows");
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
        assert!(dst == want, "k {k} chunk {chunk}");
    }
    assert!(
        Source::strided(&m[..100], l).is_err(),
        "layout outside its buffer"
    );
    // Chunks of fewer bytes than a row: each chunk is one whole row, more than the slots were
    // made for; the slots grow to it (they were sized to `chunk_bytes` and written past their
    // end). The same pipeline then runs a contiguous source of small chunks again.
    let row = 58 * 4;
    for (k, chunk) in [(1, 1), (2, 100), (3, row - 1)] {
        let want = reference(&dense, row, OutLen::Same);
        let mut dst = vec![0u8; want.len()];
        let mut p = CpuPipeline::new(&engine, PipelineConfig::new(chunk, k)).unwrap();
        p.run(
            Source::strided(&m, l).unwrap(),
            Some(Dest::new(&mut dst)),
            |c, i, o| {
                assert_eq!((c.len, i.len(), o.len()), (row, row, row));
                stage(c, i, o);
                Ok::<(), std::convert::Infallible>(())
            },
        )
        .unwrap();
        assert!(dst == want, "rows over chunks of {chunk}, k {k}");
        let small: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        let want = reference(&small, chunk, OutLen::Same);
        let mut dst = vec![0u8; want.len()];
        p.run(Source::new(&small), Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
        assert!(
            dst == want,
            "contiguous after rows, chunks of {chunk}, k {k}"
        );
    }
}

#[test]
fn failing_stage_stops_at_its_chunk_and_leaks_nothing() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let before = threads_now();
    let mut r = Rng(77);
    for round in 0..12 {
        let n_chunks = 2 + r.below(40);
        let bad = r.below(n_chunks);
        let k = 1 + round % 4;
        let src = bytes(n_chunks * 512, round as u64);
        let mut dst = vec![0u8; src.len()];
        let mut p = CpuPipeline::new(&engine, PipelineConfig::new(512, k)).unwrap();
        let mut ran_after = 0;
        let e = p
            .run(Source::new(&src), Some(Dest::new(&mut dst)), |c, i, o| {
                if c.index > bad {
                    ran_after += 1;
                }
                if c.index == bad {
                    return Err(format!("bad chunk {}", c.index));
                }
                stage(c, i, o);
                Ok(())
            })
            .unwrap_err();
        match &e {
            PipelineError::Stage { chunk, source } => {
                assert_eq!(*chunk, bad);
                assert_eq!(source.to_string(), format!("bad chunk {bad}"));
            }
            other => panic!("round {round}: {other}"),
        }
        assert_eq!(e.chunk(), Some(bad));
        assert_eq!(ran_after, 0, "the stage ran after the failing chunk");
        // Every chunk before the failing one was written back.
        let want = reference(&src[..bad * 512], 512, OutLen::Same);
        assert!(dst[..want.len()] == want[..]);
        // The same pipeline and engine work afterwards; the barrier sees no stale failure.
        p.run(Source::new(&src), Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
        engine.barrier().unwrap();
    }
    assert_eq!(threads_now(), before, "lane threads leaked");
}

#[test]
fn panicking_stage_mid_run_is_reported_and_everything_is_dropped() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let before = threads_now();
    let src = bytes(64 * 1024, 5);
    let mut dst = vec![0u8; src.len()];
    {
        let mut p = CpuPipeline::new(&engine, PipelineConfig::new(1024, 3)).unwrap();
        let e = p
            .run(Source::new(&src), Some(Dest::new(&mut dst)), |c, i, o| {
                if c.index == 20 {
                    panic!("stage gave up");
                }
                stage(c, i, o);
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap_err();
        assert!(
            matches!(&e, PipelineError::Panicked { chunk: 20, msg } if msg == "stage gave up"),
            "{e}"
        );
        // The pipeline is dropped here, mid-way through its source.
    }
    assert_eq!(threads_now(), before, "lane threads leaked");
    let mut out = vec![0u8; 16];
    engine
        .scope(|s| Ok::<_, ferry::BarrierError>(s.memcpy(&mut out, &src[..16]).map(drop)))
        .unwrap()
        .unwrap();
    assert_eq!(out, src[..16]);
    engine.barrier().unwrap();
}

#[test]
fn two_pipelines_share_one_engine() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let (a, b) = (bytes(400_000, 6), bytes(333_333, 7));
    std::thread::scope(|s| {
        let ha = s.spawn(|| run_once(&engine, &a, 7000, 2, OutLen::Same).unwrap());
        let hb = s.spawn(|| run_once(&engine, &b, 5000, 3, OutLen::Fixed(8)).unwrap());
        ha.join().unwrap();
        hb.join().unwrap();
    });
    engine.barrier().unwrap();
}

#[test]
fn timeline_orders_each_chunks_steps_and_exports_chrome_trace() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let src = bytes(40 * 4096 + 5, 8);
    let mut dst = vec![0u8; src.len()];
    let cfg = PipelineConfig::new(4096, 3).timeline(true);
    let mut p = CpuPipeline::new(&engine, cfg).unwrap();
    let rep = p
        .run(Source::new(&src), Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
    let t = rep.timeline.expect("a timeline was asked for");
    assert_eq!(t.chunks.len(), 41);
    for c in &t.chunks {
        let (u, k, d) = (c.upload.unwrap(), c.compute.unwrap(), c.download.unwrap());
        assert!(u.start_us <= u.end_us && u.end_us <= k.start_us, "{c:?}");
        assert!(k.end_us <= d.start_us && d.start_us <= d.end_us, "{c:?}");
    }
    // A slot is reused only after its previous chunk's compute (upload i after compute i-3).
    for w in t.chunks.windows(4) {
        assert!(w[3].upload.unwrap().start_us >= w[0].compute.unwrap().end_us);
    }
    assert!(t.busy_us(Phase::Compute) > 0.0 && t.wall_us() >= t.busy_us(Phase::Compute));
    let json = t.to_chrome_trace("cpu pipeline");
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 41 * 3);
    let rep = p
        .run(Source::new(&src), Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
    assert!(rep.timeline.is_some());
}

#[test]
fn bad_settings_are_refused() {
    let _g = serial();
    let engine = CpuEngine::new(1).unwrap();
    assert!(matches!(
        CpuPipeline::new(&engine, PipelineConfig::new(0, 2)),
        Err(PipelineError::Config(_))
    ));
    assert!(matches!(
        CpuPipeline::new(&engine, PipelineConfig::new(64, 0)),
        Err(PipelineError::Config(_))
    ));
    let too_many = PipelineConfig::new(64, 2).fill_threads(ferry::pipeline::FILL_THREADS_MAX + 1);
    assert!(matches!(
        CpuPipeline::new(&engine, too_many),
        Err(PipelineError::Config(m)) if m.contains("fill_threads")
    ));
    // Were aborts: 2^40 slots asked for terabytes of slot headers, a chunk of 2^46 bytes for
    // slots no machine has; 2^63 overflowed the allocator's size.
    let slots = PipelineConfig::new(64, ferry::pipeline::SLOTS_MAX + 1);
    assert!(matches!(
        CpuPipeline::new(&engine, slots),
        Err(PipelineError::Config(m)) if m.contains("slots")
    ));
    for huge in [1usize << 46, 1 << 63] {
        assert!(matches!(
            CpuPipeline::new(&engine, PipelineConfig::new(huge, 2)),
            Err(PipelineError::Setup(m)) if m.contains("cannot allocate")
        ));
    }
    let mut p = CpuPipeline::new(&engine, PipelineConfig::new(64, 2)).unwrap();
    let src = [1u8; 100];
    let mut short = [0u8; 99];
    let e = p
        .run(
            Source::new(&src[..]),
            Some(Dest::new(&mut short[..])),
            |_, _, _| Ok::<(), std::convert::Infallible>(()),
        )
        .unwrap_err();
    assert!(matches!(e, PipelineError::Config(_)), "{e}");
}

/// A temporary file holding `data`, removed on drop.
struct TempFile(std::path::PathBuf);
impl TempFile {
    fn new(tag: &str, data: &[u8]) -> TempFile {
        let p = std::env::temp_dir().join(format!("ferry-pipe-{tag}-{}", std::process::id()));
        std::fs::write(&p, data).unwrap();
        TempFile(p)
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A file range streamed chunk by chunk through the slots (no buffer of the whole file): the
/// outputs equal the reference over the same bytes, for random ranges, chunk sizes and K.
#[test]
fn file_source_matches_reference_for_random_ranges_and_every_k() {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let files = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let data = bytes(400_000, 77);
    let tmp = TempFile::new("src", &data);
    let file = files.open(&tmp.0, OpenMode::Read).unwrap();
    let mut r = Rng(0xF11E);
    for round in 0..16 {
        let off = r.below(100_000);
        let n = r.below(data.len() - off + 1);
        let chunk = 1 + r.below(90_000);
        let k = 1 + round % 4;
        let want = reference(&data[off..off + n], chunk, OutLen::Same);
        let mut dst = vec![0u8; want.len()];
        let mut p = CpuPipeline::new(&engine, PipelineConfig::new(chunk, k)).unwrap();
        let src = Source::file(&files, &file, off as u64, n).unwrap();
        let rep = p
            .run(src, Some(Dest::new(&mut dst)), |c, i, o| {
                stage(c, i, o);
                Ok::<(), std::convert::Infallible>(())
            })
            .unwrap_or_else(|e| panic!("offset {off} len {n} chunk {chunk} k {k}: {e}"));
        assert_eq!(rep.chunks, n.div_ceil(chunk));
        if let Some(b) = dst.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("offset {off} len {n} chunk {chunk} k {k}: output differs at byte {b}");
        }
    }
    // A range past the end of the file fails the first chunk that reaches past it, and the
    // pipeline and both engines stay usable.
    let chunk = 64 << 10;
    let mut p = CpuPipeline::new(&engine, PipelineConfig::new(chunk, 3)).unwrap();
    let mut dst = vec![0u8; data.len() + chunk];
    let src = Source::file(&files, &file, 0, data.len() + chunk).unwrap();
    let e = p
        .run(src, Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap_err();
    assert_eq!(e.chunk(), Some(data.len() / chunk), "{e}");
    assert!(
        matches!(
            e,
            PipelineError::Copy {
                phase: Phase::Upload,
                ..
            }
        ),
        "{e}"
    );
    let mut dst = vec![0u8; data.len()];
    let src = Source::file(&files, &file, 0, data.len()).unwrap();
    p.run(src, Some(Dest::new(&mut dst)), |c, i, o| {
        stage(c, i, o);
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap();
    assert!(dst == reference(&data, chunk, OutLen::Same));
    assert!(Source::file(&files, &file, u64::MAX, 2).is_err());
}

/// A ratio whose numerator times a chunk's length overflows `usize` (here 1:1 as
/// `usize::MAX / usize::MAX`): each output is as long as its input (the product once
/// overflowed: a panic in debug builds, one-byte outputs in release builds).
#[test]
fn ratio_with_a_huge_numerator_keeps_its_value() {
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let src = bytes(10_000, 17);
    let same = OutLen::Ratio {
        num: usize::MAX,
        den: usize::MAX,
    };
    assert_eq!(same.of(4096), 4096);
    let got = run_once(&engine, &src, 4096, 2, same).expect("run");
    assert_eq!(
        got,
        run_once(&engine, &src, 4096, 2, OutLen::Same).expect("run")
    );
}

/// A run's chunk list is planned before it starts: one of more than `CHUNKS_MAX` chunks is
/// refused with `PipelineError::Config` naming `chunk_bytes` and the smallest that fits, before
/// anything is allocated or read (`chunk_bytes = 1` over a file range of 1 TiB once asked for a
/// list of 2^40 chunks, 40 TiB, and aborted out of memory; 1 GiB asked for 40 GiB). The
/// pipeline stays usable.
#[test]
fn too_many_chunks_are_refused_before_the_run() {
    use ferry::file::{FileConfig, FileEngine, OpenMode};
    use ferry::pipeline::CHUNKS_MAX;
    let _g = serial();
    let engine = CpuEngine::new(2).unwrap();
    let files = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let data = bytes(4096, 5);
    let tmp = TempFile::new("chunks", &data);
    let file = files.open(&tmp.0, OpenMode::Read).unwrap();
    let never = |_: &Chunk, _: &[u8], _: &mut [u8]| -> Result<(), std::convert::Infallible> {
        panic!("the stage ran")
    };
    let mut p = CpuPipeline::new(&engine, PipelineConfig::new(1, 2)).unwrap();
    for len in [1usize << 40, 1 << 30, CHUNKS_MAX + 1] {
        let src = Source::file(&files, &file, 0, len).unwrap();
        let e = p.run(src, None, never).unwrap_err();
        let fits = len.div_ceil(CHUNKS_MAX);
        assert!(
            matches!(&e, PipelineError::Config(m)
                if m.contains("chunk_bytes 1 ") && m.contains(&format!("at least {fits}"))),
            "{len}: {e}"
        );
    }
    // A memory source too: CHUNKS_MAX + 1 one-byte chunks.
    let big = vec![0u8; CHUNKS_MAX + 1];
    let e = p.run(Source::new(&big[..]), None, never).unwrap_err();
    assert!(
        matches!(&e, PipelineError::Config(m) if m.contains("at least 2")),
        "{e}"
    );
    // A strided one: whole rows, so the smallest that fits is a multiple of the row.
    let rows = Layout::contiguous(&[CHUNKS_MAX + 1, 1], 1).unwrap();
    let e = p
        .run(Source::strided(&big[..], rows).unwrap(), None, never)
        .unwrap_err();
    assert!(
        matches!(&e, PipelineError::Config(m) if m.contains("at least 2")),
        "{e}"
    );
    drop(big);
    // Still usable: the same pipeline runs a plan that fits.
    let mut dst = vec![0u8; data.len()];
    let src = Source::file(&files, &file, 0, data.len()).unwrap();
    let rep = p
        .run(src, Some(Dest::new(&mut dst)), |c, i, o| {
            stage(c, i, o);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap();
    assert_eq!(rep.chunks, data.len());
    assert!(dst == reference(&data, 1, OutLen::Same));
}
