//! The cold-read rows: `O_DIRECT` reads (from the disk, never the page cache) by ferry's file
//! engine issuing them through io_uring, next to the same engine with its worker threads
//! (io_uring off, every other setting the same) and raw `pread`s with `O_DIRECT` on N threads
//! (the disk's own rate), in the same run on the same file. The shape column prints
//! io_uring / threads. Where the kernel refuses io_uring, the threads' series is ferry's and the
//! shape says why.

use super::{par_pread, FileBench};
use crate::bench::ctx::{setup, threads_label, Ctx, HostSeries};
use crate::bench::data::first_diff;
use crate::bench::{measure, BenchError, Kind, Method, Role, Row, Series};
use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer};
use ferry::file::{FileConfig, FileEngine, IoReport, OpenMode, UringMode};
use ferry::memory::AlignedBuffer;
use ferry::Engine;
use std::cell::RefCell;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;

/// The two engines of a cold row: io_uring (`Err(why)` where unavailable) and threads.
type Pair = (Result<FileEngine, String>, FileEngine);

fn engines(threads: usize, mover: Option<Arc<dyn Engine>>) -> Result<Pair, BenchError> {
    let cfg = FileConfig::from_env()
        .map_err(setup)?
        .threads(threads)
        .direct(true);
    let make = |c: FileConfig| match &mover {
        Some(m) => FileEngine::with_engine(c, Arc::clone(m)),
        None => FileEngine::new(c),
    };
    let uring = make(cfg.uring(UringMode::On)).map_err(|e| e.to_string());
    Ok((uring, make(cfg.uring(UringMode::Off)).map_err(setup)?))
}

/// Series names and the shape's words for a pair.
struct Names {
    uring: String,
    threads: String,
}

fn names(pair: &Pair, suffix: &str) -> Names {
    let depth = pair.0.as_ref().map_or(0, |e| e.config().uring_depth);
    let n = pair.1.config().threads;
    Names {
        uring: format!("ferry file io_uring depth {depth}{suffix}"),
        threads: format!("ferry file({n}) threads{suffix}"),
    }
}

/// The row, its shape `file -> ...; io_uring / threads 1.07x; ferry: <path>, issued by <how>`.
fn row(
    ctx: &Ctx,
    size: usize,
    what: &str,
    pair: &Pair,
    series: Vec<Series>,
    last: &IoReport,
) -> Result<Row, BenchError> {
    let ratio = match (&pair.0, &series[..]) {
        (Ok(_), [u, t, ..]) => format!("io_uring / threads {:.2}x", u.median / t.median),
        (Err(why), _) => format!("io_uring not run: {why}"),
        _ => String::new(),
    };
    let issued = last.issued.as_ref().map(ToString::to_string);
    let shape = format!(
        "{what}, O_DIRECT (cold: read from the disk); {ratio}; ferry: {}, issued by {}",
        last.path(),
        issued.unwrap_or_default()
    );
    let size = size as u64;
    Ok(Row::new(
        ctx.test,
        Kind::Bandwidth,
        size,
        size,
        shape,
        series,
    ))
}

/// `dst.len()` bytes from offset 0: the aligned part by `pread`s on `n` threads through the
/// `O_DIRECT` descriptor, the tail through the buffered one.
fn pread_direct(
    direct: &std::fs::File,
    buffered: &std::fs::File,
    dst: &mut [u8],
    n: usize,
) -> Result<(), String> {
    let aligned = dst.len() / 4096 * 4096;
    let (head, tail) = dst.split_at_mut(aligned);
    par_pread(direct, head, n, 4096)?;
    buffered
        .read_exact_at(tail, aligned as u64)
        .map_err(|e| e.to_string())
}

fn open_direct(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

impl FileBench {
    /// `file-read-direct`: file -> page-aligned host memory, straight into the buffer.
    pub(super) fn read_host_direct(&mut self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let pair = engines(self.threads, None)?;
        let nm = names(&pair, "");
        let tf = self.temp();
        let open = |e: &FileEngine| {
            e.open(&tf.path, OpenMode::Read)
                .map_err(|e| ctx.engine_err("open", e.to_string()))
        };
        let ft = open(&pair.1)?;
        let fu = pair.0.as_ref().ok().map(open).transpose()?;
        let raw =
            open_direct(&tf.path).map_err(|e| ctx.engine_err("open O_DIRECT", e.to_string()))?;
        let buffered =
            std::fs::File::open(&tf.path).map_err(|e| ctx.engine_err("open", e.to_string()))?;
        let n = self.threads;
        let mut dst = AlignedBuffer::new(size).map_err(setup)?;
        // What ferry's series last did (two series may write it; read after they are done).
        let last = RefCell::new(IoReport::default());
        let verify = |d: &[u8]| first_diff(d, &tf.data);
        let mut s = HostSeries::new(ctx, &self.method, (&mut dst[..], 0xA5), size, verify);
        if let (Ok(e), Some(f)) = (&pair.0, &fu) {
            s.run(&nm.uring, Role::Ferry, |d| {
                *last.borrow_mut() = e.load_into(f, 0, d).map_err(|e| e.to_string())?;
                Ok(())
            })?;
        }
        let role = if fu.is_some() {
            Role::Baseline
        } else {
            Role::Ferry
        };
        s.run(&nm.threads, role, |d| {
            let r = pair.1.load_into(&ft, 0, d).map_err(|e| e.to_string())?;
            if fu.is_none() {
                *last.borrow_mut() = r;
            }
            Ok(())
        })?;
        s.run(
            &format!("pread O_DIRECT {}", threads_label(n)),
            Role::Baseline,
            |d| pread_direct(&raw, &buffered, d, n),
        )?;
        let series = s.done()?;
        row(
            ctx,
            size,
            "file -> aligned pageable host",
            &pair,
            series,
            &last.into_inner(),
        )
    }

    /// `cuda-file-read-direct`: file -> device through the pinned bounce ring, each slot filled
    /// by an io_uring read (or a worker's `pread`).
    pub(super) fn read_device_direct(&mut self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let cuda = CudaConfig::from_env(0).map_err(setup)?;
        let cuda: Arc<dyn Engine> = Arc::new(CudaEngine::with_config(cuda).map_err(setup)?);
        let pair = engines(self.threads, Some(cuda))?;
        let nm = names(&pair, " + cuda:0");
        let tf = self.temp();
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let mut series = vec![];
        let mut run = |e: &FileEngine, name: &str, role: Role, last: &mut IoReport| {
            let f = e
                .open(&tf.path, OpenMode::Read)
                .map_err(|e| ctx.engine_err("open", e.to_string()))?;
            time_device(
                ctx,
                &self.method,
                &mut dev,
                &tf.data,
                name,
                role,
                &mut |d| {
                    *last = e.load_into(&f, 0, d).map_err(|e| e.to_string())?;
                    Ok(())
                },
            )
        };
        let (mut uring_last, mut threads_last) = (IoReport::default(), IoReport::default());
        if let Ok(e) = &pair.0 {
            series.push(run(e, &nm.uring, Role::Ferry, &mut uring_last)?);
        }
        let role = if pair.0.is_ok() {
            Role::Baseline
        } else {
            Role::Ferry
        };
        series.push(run(&pair.1, &nm.threads, role, &mut threads_last)?);
        let last = if pair.0.is_ok() {
            uring_last
        } else {
            threads_last
        };
        row(ctx, size, "file -> device", &pair, series, &last)
    }
}

/// Poisons `dev`, times `op` on it, reads it back and checks it against `want`.
pub(super) fn time_device(
    ctx: &Ctx,
    method: &Method,
    dev: &mut DeviceBuffer,
    want: &[u8],
    name: &str,
    role: Role,
    op: &mut dyn FnMut(&mut DeviceBuffer) -> Result<(), String>,
) -> Result<Series, BenchError> {
    dev.copy_from_host(&vec![0xA5u8; want.len()])
        .map_err(setup)?;
    let timing = measure(method, || op(dev)).map_err(|m| ctx.engine_err(name, m))?;
    let back = dev.to_vec().map_err(setup)?;
    first_diff(&back, want).map_err(|offset| ctx.verify_err(name, offset))?;
    let n = want.len() as u64;
    Ok(Series::new(name, role, Kind::Bandwidth, n, timing))
}

#[cfg(test)]
mod tests {
    use super::super::{FileBench, TESTS};
    use crate::bench::{Method, Needs};

    #[test]
    fn file_read_direct_runs_and_verifies() {
        let t = TESTS.iter().find(|t| t.name == "file-read-direct").unwrap();
        let method = Method {
            warmup: 1,
            samples: 2,
            min_sample_s: 0.0,
        };
        let mut b = FileBench::new(2, method).unwrap();
        for size in [4096u64, 1_000_001, 3 << 20] {
            let row = b.run(t, size).unwrap();
            assert!(row.series.iter().all(|s| s.verified && s.median > 0.0));
            // io_uring's series where the kernel allows it, else the reason.
            let n = row.series.len();
            assert!(
                (n == 3 && row.shape.contains("io_uring / threads"))
                    || (n == 2 && row.shape.contains("io_uring not run")),
                "{}",
                row.shape
            );
            assert!(row.ratio.is_finite(), "{}", row.shape);
        }
        let gpu = TESTS.iter().find(|t| t.name == "cuda-file-read-direct");
        assert_eq!(gpu.map(|t| t.needs), Some(Needs::Cuda));
    }
}
