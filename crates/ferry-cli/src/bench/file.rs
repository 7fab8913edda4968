//! File tests of `ferry bench`: ferry's file engine next to plain reads, in the same run, on the
//! same file and buffers.
//!
//! The file is written once per size into the temp dir (`std::env::temp_dir()`, nameless, so
//! it never outlives the run) and read by every series; the warm-up calls bring it into the page cache, so the rows
//! show the speed of the path itself, not the disk's (the design notes' H200 host reads
//! 1.6-2.2 GB/s from disk with `O_DIRECT`). `FERRY_FILE_DIRECT=1` makes ferry's series use
//! `O_DIRECT` (then it reads the disk; the shape column says which path ran).

use super::ctx::{setup, threads_label, Ctx, HostSeries};
use super::data::{first_diff, pattern_bytes};
use super::{BenchError, Kind, Method, Needs, Role, Row, TestInfo};
use ferry::cuda::{CudaConfig, CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::file::{CuFileMode, FileConfig, FileEngine, FileHandle, OpenMode};
use ferry_bench::RawCopier;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

mod direct;

/// The file tests.
pub static TESTS: &[TestInfo] = &[
    TestInfo::new(
        "file-read",
        "file (page cache warm) -> pageable host, ferry's file engine vs File::read_exact on 1 thread and pread on N threads",
        Needs::Cpu,
        Kind::Bandwidth,
        "16M,256M",
    ),
    TestInfo::new(
        "cuda-file-read",
        "file (page cache warm) -> device through ferry's pinned bounce ring, vs read into pinned memory (1 and N threads) + cuMemcpyHtoD",
        Needs::Cuda,
        Kind::Bandwidth,
        "16M,256M",
    ),
    TestInfo::new(
        "file-read-direct",
        "file -> aligned host with O_DIRECT (cold: the disk), ferry's file engine through io_uring vs its threads vs pread O_DIRECT on N threads",
        Needs::Cpu,
        Kind::Bandwidth,
        "64M,1G",
    ),
    TestInfo::new(
        "cuda-file-read-direct",
        "file -> device with O_DIRECT (cold: the disk) through the pinned bounce ring, slots filled by io_uring vs by ferry's threads",
        Needs::Cuda,
        Kind::Bandwidth,
        "64M,1G",
    ),
    TestInfo::new(
        "cuda-file-read-cufile",
        "file (page cache warm) -> device through cuFile (FileConfig::cufile(On); compat mode without nvidia-fs), vs ferry's bounce ring and pread on N threads into pinned + cuMemcpyHtoD",
        Needs::Cuda,
        Kind::Bandwidth,
        "16M,256M",
    ),
];

/// True for the tests of this module.
pub fn owns(name: &str) -> bool {
    TESTS.iter().any(|t| t.name == name)
}

/// A test file with no name: made in the temp dir and unlinked at once (`O_TMPFILE`), so it
/// never outlives the process, even one killed by a signal. The engines open it again through
/// `/proc/self/fd/N`. A named file removed on drop (also when a row fails or panics; not after
/// SIGKILL) is used instead where that is missing, and for cuFile, which reopens a file by its
/// name and refuses one without (`CU_FILE_GETNEWFD_FAILED`).
struct TempFile {
    path: PathBuf,
    data: Vec<u8>,
    /// Keeps the nameless file alive (or, for the fallback, removes the named one on drop).
    keep: Keep,
}

enum Keep {
    Nameless { _file: std::fs::File },
    Named { _path: tempfile::TempPath },
}

impl TempFile {
    /// `named`: a named file even where a nameless one can be made.
    fn new(data: Vec<u8>, named: bool) -> std::io::Result<TempFile> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        if !named && std::path::Path::new("/proc/self/fd").is_dir() {
            let mut f = tempfile::tempfile()?;
            f.write_all(&data)?;
            f.flush()?;
            let path = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
            return Ok(TempFile {
                path,
                data,
                keep: Keep::Nameless { _file: f },
            });
        }
        let mut f = tempfile::Builder::new()
            .prefix("ferry-bench-file-")
            .tempfile()?;
        f.write_all(&data)?;
        f.flush()?;
        let path = f.path().to_path_buf();
        Ok(TempFile {
            path,
            data,
            keep: Keep::Named {
                _path: f.into_temp_path(),
            },
        })
    }
}

/// Runs the file tests: one file engine (and, for the GPU test, a CUDA engine), made once.
pub struct FileBench {
    threads: usize,
    method: Method,
    host: FileEngine,
    /// The bounce ring's engine, the cuFile one (`CuFileMode::On`), and the raw copier.
    gpu: Option<(FileEngine, FileEngine, RawCopier)>,
    file: Option<TempFile>,
}

impl FileBench {
    /// A file engine with `threads` workers (the N of the threaded baselines).
    pub fn new(threads: usize, method: Method) -> Result<FileBench, BenchError> {
        let threads = threads.max(1);
        // FERRY_FILE_* tune the engine (--threads sets the workers).
        let cfg = FileConfig::from_env().map_err(setup)?;
        let host = FileEngine::new(cfg.threads(threads)).map_err(setup)?;
        Ok(FileBench {
            threads,
            method,
            host,
            gpu: None,
            file: None,
        })
    }

    /// Runs one file test at one size.
    pub fn run(&mut self, test: &TestInfo, size: u64) -> Result<Row, BenchError> {
        let ctx = Ctx::new(test, size);
        let size = usize::try_from(size).map_err(|_| ctx.bad("larger than the address space"))?;
        if size == 0 {
            return Err(ctx.bad("zero bytes"));
        }
        self.file_of(size, test.name == "cuda-file-read-cufile", &ctx)?;
        match test.name {
            "file-read" => self.read_host(&ctx, size),
            "file-read-direct" => self.read_host_direct(&ctx, size),
            "cuda-file-read-direct" => self.read_device_direct(&ctx, size),
            "cuda-file-read" => self.read_device(&ctx, size, false),
            "cuda-file-read-cufile" => self.read_device(&ctx, size, true),
            _ => Err(BenchError::UnknownTest {
                name: test.name.into(),
                valid: TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// Makes (or reuses) the test file of `size` bytes, `named` for cuFile ([`TempFile`]).
    fn file_of(&mut self, size: usize, named: bool, ctx: &Ctx) -> Result<(), BenchError> {
        let is_named = |f: &TempFile| matches!(f.keep, Keep::Named { .. });
        if (self.file.as_ref()).is_some_and(|f| f.data.len() == size && (!named || is_named(f))) {
            return Ok(());
        }
        self.file = None;
        let file = TempFile::new(pattern_bytes(size), named).map_err(|e| {
            ctx.bad(&format!(
                "cannot write a test file in {}: {e}",
                std::env::temp_dir().display()
            ))
        })?;
        self.file = Some(file);
        Ok(())
    }

    fn temp(&self) -> &TempFile {
        self.file.as_ref().expect("file_of made the file")
    }

    fn read_host(&mut self, ctx: &Ctx, size: usize) -> Result<Row, BenchError> {
        let tf = self.temp();
        let f = self
            .host
            .open(&tf.path, OpenMode::Read)
            .map_err(|e| ctx.engine_err("open", e.to_string()))?;
        let std_file =
            std::fs::File::open(&tf.path).map_err(|e| ctx.engine_err("open", e.to_string()))?;
        let n = self.threads;
        let mut dst = vec![0u8; size];
        let mut path_ran = String::new();
        let verify = |d: &[u8]| first_diff(d, &tf.data);
        let mut s = HostSeries::new(ctx, &self.method, (&mut dst, 0xA5), size, verify);
        s.run(&format!("ferry file({n})"), Role::Ferry, |d| {
            let r = self.host.load_into(&f, 0, d).map_err(|e| e.to_string())?;
            path_ran = r.path().to_string();
            Ok(())
        })?;
        s.run("File::read_exact 1 thread", Role::Baseline, |d| {
            // `&File` reads and seeks too: the other series share the file.
            let mut file = &std_file;
            file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
            file.read_exact(d).map_err(|e| e.to_string())
        })?;
        s.run(
            &format!("pread {}", threads_label(n)),
            Role::Baseline,
            |d| par_pread(&std_file, d, n, 1),
        )?;
        let series = s.done()?;
        Ok(Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            size as u64,
            format!("file -> pageable host, page cache warm; ferry: {path_ran}"),
            series,
        ))
    }

    /// `cufile`: the cuFile row (cuFile as ferry's series, the bounce ring as a baseline).
    fn read_device(&mut self, ctx: &Ctx, size: usize, cufile: bool) -> Result<Row, BenchError> {
        if cufile {
            cufile_or_refuse()?;
        }
        if self.gpu.is_none() {
            let cuda = CudaConfig::from_env(0).map_err(setup)?;
            let cuda = Arc::new(CudaEngine::with_config(cuda).map_err(setup)?);
            let cfg = FileConfig::from_env().map_err(setup)?.threads(self.threads);
            let fe = FileEngine::with_engine(cfg, cuda.clone()).map_err(setup)?;
            let fc = FileEngine::with_engine(cfg.cufile(CuFileMode::On), cuda).map_err(setup)?;
            self.gpu = Some((fe, fc, RawCopier::new(0).map_err(setup)?));
        }
        let (fe, fc, raw) = self.gpu.as_ref().expect("made above");
        let tf = self.file.as_ref().expect("file_of made the file");
        let f: FileHandle = fe
            .open(&tf.path, OpenMode::Read)
            .map_err(|e| ctx.engine_err("open", e.to_string()))?;
        let mut std_file =
            std::fs::File::open(&tf.path).map_err(|e| ctx.engine_err("open", e.to_string()))?;
        let n = self.threads;
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let mut pinned = PinnedBuffer::new(size).map_err(setup)?;
        let mut path_ran = String::new();
        let mut series = vec![];
        // Each device series: poison the device buffer, time, read it back and compare.
        let mut dev_series =
            |name: &str,
             role: Role,
             op: &mut dyn FnMut(&mut DeviceBuffer) -> Result<(), String>| {
                direct::time_device(ctx, &self.method, &mut dev, &tf.data, name, role, op)
            };
        if cufile {
            // The cuFile engine opens the file itself (its handle is registered once).
            let fcf = fc
                .open(&tf.path, OpenMode::Read)
                .map_err(|e| ctx.engine_err("open", e.to_string()))?;
            // A host where cuFile refuses the file (on the H200 host libcufile finds no udev
            // data for the disk and registers no file, compat mode included): the row is
            // skipped with cuFile's reason, the other rows run.
            let mut probe = DeviceBuffer::new(0, size.min(4096)).map_err(setup)?;
            let r = fc
                .load_into(&fcf, 0, &mut probe)
                .map_err(|e| ctx.engine_err("cuFile probe", e.to_string()))?;
            if !r.transport.is_cufile() {
                return Err(BenchError::Unavailable {
                    test: "cuda-file-read-cufile".into(),
                    why: format!("cuFile not used: {}", r.gds_note.unwrap_or_default()),
                });
            }
            let mut cufile_ran = String::new();
            series.push(dev_series(
                &format!("ferry cuFile file({n}) + cuda:0"),
                Role::Ferry,
                &mut |d| {
                    let r = fc.load_into(&fcf, 0, d).map_err(|e| e.to_string())?;
                    if !r.transport.is_cufile() {
                        return Err(format!(
                            "cuFile not used: {}",
                            r.gds_note.unwrap_or_default()
                        ));
                    }
                    cufile_ran = r.gds_note.unwrap_or_default();
                    Ok(())
                },
            )?);
            series.push(dev_series(
                &format!("ferry bounce ring file({n}) + cuda:0"),
                Role::Baseline,
                &mut |d| {
                    fe.load_into(&f, 0, d)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
            )?);
            let ratio = series[0].median / series[1].median;
            path_ran = format!("{cufile_ran}; cuFile / bounce ring {ratio:.2}x");
        } else {
            series.push(dev_series(
                &format!("ferry file({n}) + cuda:0"),
                Role::Ferry,
                &mut |d| {
                    let r = fe.load_into(&f, 0, d).map_err(|e| e.to_string())?;
                    path_ran = format!("{}, {}", r.path(), r.gds_note.unwrap_or_default());
                    Ok(())
                },
            )?);
            series.push(dev_series(
                "read_exact into pinned + cuMemcpyHtoD",
                Role::Baseline,
                &mut |d| {
                    std_file
                        .seek(SeekFrom::Start(0))
                        .map_err(|e| e.to_string())?;
                    std_file
                        .read_exact(&mut pinned)
                        .map_err(|e| e.to_string())?;
                    raw.copy(d, &*pinned, size, 1).map_err(|e| e.to_string())
                },
            )?);
        }
        series.push(dev_series(
            &format!("pread {} into pinned + cuMemcpyHtoD", threads_label(n)),
            Role::Baseline,
            &mut |d| {
                par_pread(&std_file, &mut pinned, n, 1)?;
                raw.copy(d, &*pinned, size, 1).map_err(|e| e.to_string())
            },
        )?);
        Ok(Row::new(
            ctx.test,
            Kind::Bandwidth,
            size as u64,
            size as u64,
            format!("file -> device, page cache warm; ferry: {path_ran}"),
            series,
        ))
    }
}

/// Refuses the cuFile row where `libcufile` is missing; without `nvidia-fs`, lets cuFile run in
/// its compatibility mode first ([`allow_cufile_compat`](crate::load::allow_cufile_compat)).
fn cufile_or_refuse() -> Result<(), BenchError> {
    crate::load::allow_cufile_compat();
    if !ferry::file::gds_probe().libcufile {
        return Err(setup("no cuFile: libcufile.so.0 was not found"));
    }
    Ok(())
}

/// `read_exact_at` of `dst.len()` bytes from offset 0, split into `n` chunks (multiples of
/// `align` bytes) on `n` scoped threads.
fn par_pread(f: &std::fs::File, dst: &mut [u8], n: usize, align: usize) -> Result<(), String> {
    let chunk = dst.len().div_ceil(n).div_ceil(align).max(1) * align;
    std::thread::scope(|s| {
        let hs: Vec<_> = dst
            .chunks_mut(chunk)
            .enumerate()
            .map(|(i, d)| s.spawn(move || f.read_exact_at(d, (i * chunk) as u64)))
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| "a pread thread panicked".to_string())?
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_read_runs_and_verifies() {
        let mut b = FileBench::new(
            2,
            Method {
                warmup: 1,
                samples: 2,
                min_sample_s: 0.0,
            },
        )
        .unwrap();
        for size in [4096u64, 1 << 20, 1_000_001] {
            let row = b.run(&TESTS[0], size).unwrap();
            assert_eq!(row.series.len(), 3);
            assert!(row.series.iter().all(|s| s.verified && s.median > 0.0));
            assert!(
                row.shape.contains("buffered") || row.shape.contains("O_DIRECT"),
                "{}",
                row.shape
            );
        }
        let path = b.temp().path.clone();
        drop(b);
        assert!(!path.exists(), "the bench file is removed");
    }

    #[test]
    fn cuda_file_read_needs_cuda() {
        for t in TESTS {
            let want = if t.name.starts_with("cuda-") {
                Needs::Cuda
            } else {
                Needs::Cpu
            };
            assert_eq!(t.needs, want, "{}", t.name);
        }
        assert!(owns("cuda-file-read-cufile") && owns("cuda-file-read-direct"));
        assert!(owns("cuda-file-read") && owns("file-read") && !owns("cpu-contig"));
    }
}
