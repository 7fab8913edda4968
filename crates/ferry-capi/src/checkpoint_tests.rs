//! `ferry_checkpoint_*` through the C ABI on host memory: round trips (one file, a sharded
//! folder, in the background), every check before a byte moves, errors as codes and messages.

use crate::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};

fn last() -> String {
    // SAFETY: no arguments; the pointer is read before the next call on this thread.
    unsafe { CStr::from_ptr(ferry_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn tensor(name: &CStr, dtype: i32, shape: &[usize], data: &mut [u8]) -> FerryTensor {
    FerryTensor {
        name: name.as_ptr(),
        dtype,
        ndims: shape.len(),
        shape: if shape.is_empty() {
            null()
        } else {
            shape.as_ptr()
        },
        buf: FerryBuffer {
            ptr: data.as_mut_ptr() as *mut c_void,
            len: data.len(),
            kind: FERRY_MEM_PAGEABLE,
            device: 0,
        },
    }
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ferry-capi-ckpt-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn c_path(p: &std::path::Path) -> CString {
    CString::new(p.to_str().unwrap()).unwrap()
}

/// Three tensors (f32 matrix, bf16 vector, i64 scalar) and their names.
struct Model {
    names: [CString; 3],
    shapes: [Vec<usize>; 3],
    data: [Vec<u8>; 3],
}

impl Model {
    fn new(seed: u8) -> Model {
        Model {
            names: [c"w".into(), c"b".into(), c"step".into()],
            shapes: [vec![64, 32], vec![100], vec![]],
            data: [
                (0..64 * 32 * 4)
                    .map(|i| (i as u8).wrapping_mul(seed))
                    .collect(),
                (0..200).map(|i| (i as u8) ^ seed).collect(),
                (7i64 + seed as i64).to_le_bytes().to_vec(),
            ],
        }
    }
    fn zeroed() -> Model {
        let mut m = Model::new(1);
        m.data.iter_mut().for_each(|d| d.fill(0));
        m
    }
    fn tensors(&mut self) -> Vec<FerryTensor> {
        let dtypes = [FERRY_DTYPE_F32, FERRY_DTYPE_BF16, FERRY_DTYPE_I64];
        let Model {
            names,
            shapes,
            data,
        } = self;
        names
            .iter()
            .zip(shapes.iter())
            .zip(data.iter_mut())
            .zip(dtypes)
            .map(|(((n, s), d), t)| tensor(n, t, s, d))
            .collect()
    }
}

fn save(path: &CStr, ts: &[FerryTensor], opts: Option<&FerryCheckpointOptions>) -> i32 {
    // SAFETY: live tensors and path; opts NULL or live.
    unsafe {
        ferry_checkpoint_save(
            path.as_ptr(),
            ts.as_ptr(),
            ts.len(),
            opts.map_or(null(), |o| o as *const _),
            null_mut(),
        )
    }
}

fn load(path: &CStr, ts: &mut [FerryTensor], report: &mut FerryCheckpointReport) -> i32 {
    // SAFETY: live tensors, path and report.
    unsafe { ferry_checkpoint_load(path.as_ptr(), ts.as_mut_ptr(), ts.len(), null(), report) }
}

#[test]
fn save_then_load_round_trips_one_file_and_a_sharded_folder() {
    let dir = tmp("round");
    let mut m = Model::new(3);
    let ts = m.tensors();
    let file = c_path(&dir.join("m.safetensors"));
    assert_eq!(save(&file, &ts, None), FERRY_SUCCESS, "{}", last());
    // The headers say what was given (the library checks them as the reference reader does).
    let fe = ferry::file::FileEngine::new(ferry::file::FileConfig::new().threads(1)).unwrap();
    let entries = ferry::checkpoint::entries(&fe, dir.join("m.safetensors")).unwrap();
    let mut shapes: Vec<(&str, &[usize])> = entries
        .iter()
        .map(|(_, t)| (t.name.as_str(), &t.shape[..]))
        .collect();
    shapes.sort();
    assert_eq!(
        shapes,
        [("b", &[100][..]), ("step", &[][..]), ("w", &[64, 32][..])]
    );
    // A folder: sharded, small shards.
    let folder = dir.join("sharded");
    std::fs::create_dir_all(&folder).unwrap();
    let opts = FerryCheckpointOptions {
        shard_bytes: 4096,
        threads: 2,
        ..Default::default()
    };
    assert_eq!(
        save(&c_path(&folder), &ts, Some(&opts)),
        FERRY_SUCCESS,
        "{}",
        last()
    );
    assert!(folder.join("model.safetensors.index.json").is_file());
    for p in [file, c_path(&folder)] {
        let mut back = Model::zeroed();
        let mut bt = back.tensors();
        let mut r = FerryCheckpointReport::default();
        assert_eq!(load(&p, &mut bt, &mut r), FERRY_SUCCESS, "{}", last());
        drop(bt);
        assert_eq!(back.data, m.data, "{p:?}");
        assert_eq!((r.tensors, r.bytes), (3, 8192 + 200 + 8));
        assert!(r.peak_rss_bytes > 0 && r.pinned_bytes == 0, "{r:?}");
        if p.to_str().unwrap().ends_with("sharded") {
            assert!(r.files >= 2, "{r:?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_writer_writes_the_same_file_and_the_report_names_it() {
    let dir = tmp("writers");
    let mut m = Model::new(4);
    let ts = m.tensors();
    let want_file = dir.join("ref.safetensors");
    let reference = FerryCheckpointOptions {
        writer: FERRY_WRITER_BUFFERED,
        ..Default::default()
    };
    assert_eq!(
        save(&c_path(&want_file), &ts, Some(&reference)),
        FERRY_SUCCESS,
        "{}",
        last()
    );
    let want = std::fs::read(&want_file).unwrap();
    let saved = |writer: i32, fsync: i32| -> (Vec<u8>, FerryCheckpointReport) {
        let path = dir.join(format!("w{writer}-{fsync}.safetensors"));
        let opts = FerryCheckpointOptions {
            writer,
            fsync,
            ..Default::default()
        };
        let mut r = FerryCheckpointReport::default();
        // SAFETY: live tensors, path, options and report.
        let rc =
            unsafe { ferry_checkpoint_save(c_path(&path).as_ptr(), ts.as_ptr(), 3, &opts, &mut r) };
        assert_eq!(rc, FERRY_SUCCESS, "writer {writer}: {}", last());
        (std::fs::read(&path).unwrap(), r)
    };
    for writer in [
        FERRY_WRITER_AUTO,
        FERRY_WRITER_BUFFERED,
        FERRY_WRITER_DIRECT,
        FERRY_WRITER_HYBRID,
    ] {
        for fsync in [0, 1] {
            let (bytes, r) = saved(writer, fsync);
            assert!(bytes == want, "writer {writer} fsync {fsync}: other bytes");
            assert_eq!(r.bytes, want.len() as u64, "{r:?}");
            // What ran: the one asked for, or buffered where the file system refuses
            // O_DIRECT; AUTO's choice for 8 kB is buffered.
            let ran_ok = match writer {
                FERRY_WRITER_AUTO | FERRY_WRITER_BUFFERED => r.writer == FERRY_WRITER_BUFFERED,
                w => r.writer == w || r.writer == FERRY_WRITER_BUFFERED,
            };
            assert!(ran_ok, "writer {writer} fsync {fsync}: {r:?}");
        }
    }
    // An unknown writer: refused before anything is written, by both saves.
    let bad = FerryCheckpointOptions {
        writer: 7,
        ..Default::default()
    };
    let gone = c_path(&dir.join("bad.safetensors"));
    assert_eq!(save(&gone, &ts, Some(&bad)), -FERRY_EINVAL);
    assert!(last().contains("writer 7"), "{}", last());
    let mut req = null_mut();
    // SAFETY: live tensors, path, options and out-pointer.
    let rc = unsafe { ferry_checkpoint_save_async(gone.as_ptr(), ts.as_ptr(), 3, &bad, &mut req) };
    assert_eq!(rc, -FERRY_EINVAL);
    assert!(req.is_null());
    assert!(!dir.join("bad.safetensors").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_background_save_is_a_request_of_no_dma() {
    let dir = tmp("async");
    let mut m = Model::new(5);
    let want = m.data.clone();
    let ts = m.tensors();
    let path = c_path(&dir.join("a.safetensors"));
    let mut req = null_mut();
    // SAFETY: live tensors, path and out-pointer.
    let rc =
        unsafe { ferry_checkpoint_save_async(path.as_ptr(), ts.as_ptr(), 3, null(), &mut req) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    // The tensors are copied out: changing them now changes nothing in the file.
    drop(ts);
    m.data.iter_mut().for_each(|d| d.fill(0xee));
    // A dma's wait refuses it; NULL waits for it.
    let cpu = {
        let mut d = null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { ferry_dma_cpu_create(&mut d, 1) }, FERRY_SUCCESS);
        d
    };
    // SAFETY: live handles.
    assert_eq!(unsafe { ferry_request_wait(cpu, &mut req) }, -FERRY_EINVAL);
    assert!(!req.is_null());
    // `ferry_checkpoint_save_wait` takes a save's request only: a dma's is refused, kept.
    let (src, mut dst) = (vec![3u8; 64], vec![0u8; 64]);
    let mut copy = null_mut();
    // SAFETY: live dma and buffers (waited below).
    let rc = unsafe {
        ferry_dma_request_create(
            cpu,
            &mut copy,
            dst.as_mut_ptr().cast(),
            64,
            null(),
            src.as_ptr().cast_mut().cast(),
            64,
            null(),
            &ferry_op_memcpy,
            null_mut(),
        )
    };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    // SAFETY: a live request; NULLs.
    unsafe {
        assert_eq!(
            ferry_checkpoint_save_wait(&mut copy, null_mut()),
            -FERRY_EINVAL
        );
        assert!(last().contains("not an asynchronous save"), "{}", last());
        assert!(!copy.is_null(), "refused, not released");
        assert_eq!(ferry_request_wait(cpu, &mut copy), FERRY_SUCCESS);
        assert_eq!(
            ferry_checkpoint_save_wait(null_mut(), null_mut()),
            -FERRY_EINVAL
        );
        let mut none: *mut FerryRequest = null_mut();
        assert_eq!(
            ferry_checkpoint_save_wait(&mut none, null_mut()),
            -FERRY_EINVAL
        );
    }
    assert_eq!(dst, src);
    let mut done = 0;
    // SAFETY: live request, NULL dma.
    let rc = unsafe { ferry_request_test(null_mut(), req, &mut done) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    // SAFETY: live request.
    let rc = unsafe { ferry_request_wait(null_mut(), &mut req) };
    assert_eq!(rc, FERRY_SUCCESS, "{}", last());
    assert!(req.is_null());
    let mut back = Model::zeroed();
    let mut bt = back.tensors();
    let mut r = FerryCheckpointReport::default();
    assert_eq!(load(&path, &mut bt, &mut r), FERRY_SUCCESS, "{}", last());
    drop(bt);
    assert_eq!(back.data, want);
    // Saves in a loop that keep their snapshot memory (each one reuses the last one's), then
    // one that frees it: every file holds the tensors of its call.
    let kept = FerryCheckpointOptions {
        keep_snapshot: 1,
        ..Default::default()
    };
    for (i, opts) in [&kept, &kept, &FerryCheckpointOptions::default()]
        .into_iter()
        .enumerate()
    {
        m.data.iter_mut().for_each(|d| d.fill(i as u8));
        let ts = m.tensors();
        let step = c_path(&dir.join(format!("k{i}.safetensors")));
        // SAFETY: live tensors, path, options and out-pointer.
        let rc =
            unsafe { ferry_checkpoint_save_async(step.as_ptr(), ts.as_ptr(), 3, opts, &mut req) };
        assert_eq!(rc, FERRY_SUCCESS, "{}", last());
        drop(ts);
        // Waited with its report: what a save in the foreground reports for the same file.
        let mut sr = FerryCheckpointReport::default();
        // SAFETY: live request and report.
        let rc = unsafe { ferry_checkpoint_save_wait(&mut req, &mut sr) };
        assert_eq!(rc, FERRY_SUCCESS, "{}", last());
        assert!(req.is_null());
        let file = std::fs::metadata(dir.join(format!("k{i}.safetensors"))).unwrap();
        assert_eq!(
            (sr.bytes, sr.tensors, sr.files),
            (file.len(), 3, 1),
            "{sr:?}"
        );
        assert!(
            [FERRY_WRITER_BUFFERED, FERRY_WRITER_DIRECT].contains(&sr.writer),
            "{sr:?}"
        );
        let mut back = Model::zeroed();
        let mut bt = back.tensors();
        assert_eq!(load(&step, &mut bt, &mut r), FERRY_SUCCESS, "{}", last());
        drop(bt);
        assert!(
            back.data.iter().flatten().all(|&b| b == i as u8),
            "save {i}"
        );
    }
    // A failing background save (its folder vanishes before the write? the path's folder
    // does not exist: refused before anything starts) fails the call, not the request.
    let gone = c_path(&dir.join("no/such/folder/x.safetensors"));
    let ts = m.tensors();
    let mut req2 = null_mut();
    // SAFETY: as above.
    let rc =
        unsafe { ferry_checkpoint_save_async(gone.as_ptr(), ts.as_ptr(), 3, null(), &mut req2) };
    if rc == FERRY_SUCCESS {
        let mut sr = FerryCheckpointReport {
            bytes: 77,
            ..Default::default()
        };
        // SAFETY: live request and report.
        let rc = unsafe { ferry_checkpoint_save_wait(&mut req2, &mut sr) };
        assert_eq!(rc, -FERRY_EREQUEST);
        assert!(req2.is_null());
        assert_eq!(sr.bytes, 77, "a failed save leaves the report as it was");
    } else {
        assert_eq!(rc, -FERRY_EDRIVER, "{}", last());
        assert!(req2.is_null());
    }
    assert!(last().contains("x.safetensors"), "{}", last());
    let mut cpu = cpu;
    // SAFETY: a live dma.
    assert_eq!(unsafe { ferry_dma_destroy(&mut cpu) }, 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn loads_check_every_tensor_before_writing_any() {
    let dir = tmp("checks");
    let mut m = Model::new(9);
    let path = c_path(&dir.join("m.safetensors"));
    assert_eq!(save(&path, &m.tensors(), None), FERRY_SUCCESS, "{}", last());
    let mut r = FerryCheckpointReport::default();
    type Spoil = fn(&mut Vec<FerryTensor>);
    let cases: [(&str, Spoil, &str); 6] = [
        (
            "missing name",
            |t| t[1].name = c"nope".as_ptr(),
            "no tensor `nope`",
        ),
        ("short buffer", |t| t[0].buf.len -= 4, "holds 8188 bytes"),
        (
            "wrong dtype",
            |t| t[0].dtype = FERRY_DTYPE_F16,
            "expects F16",
        ),
        ("unknown dtype", |t| t[0].dtype = 99, "dtype 99"),
        ("twice", |t| t[2].name = c"w".as_ptr(), "given twice"),
        ("bad kind", |t| t[1].buf.kind = 42, "memory kind 42"),
    ];
    for (what, spoil, want) in cases {
        let mut back = Model::zeroed();
        let mut ts = back.tensors();
        spoil(&mut ts);
        let rc = load(&path, &mut ts, &mut r);
        assert_eq!(rc, -FERRY_EINVAL, "{what}: {}", last());
        assert!(last().contains(want), "{what}: {}", last());
        drop(ts);
        assert!(
            back.data.iter().all(|d| d.iter().all(|&b| b == 0)),
            "{what}: a buffer was written"
        );
    }
    // Shapes: checked where given, any where NULL.
    let mut back = Model::zeroed();
    let mut ts = back.tensors();
    let wrong = [32usize, 64];
    ts[0].shape = wrong.as_ptr();
    assert_eq!(load(&path, &mut ts, &mut r), -FERRY_EINVAL);
    assert!(last().contains("expects shape [32, 64]"), "{}", last());
    ts[0].shape = null();
    ts[0].dtype = FERRY_DTYPE_ANY;
    assert_eq!(load(&path, &mut ts, &mut r), FERRY_SUCCESS, "{}", last());
    // A file that is not there: a system error naming it.
    let gone = c_path(&dir.join("gone.safetensors"));
    assert_eq!(load(&gone, &mut ts, &mut r), -FERRY_EDRIVER);
    assert!(last().contains("gone.safetensors"), "{}", last());
    // NULL arguments.
    // SAFETY: NULL pointers are checked.
    let rc = unsafe { ferry_checkpoint_load(null(), ts.as_mut_ptr(), 3, null(), null_mut()) };
    assert_eq!(rc, -FERRY_EINVAL);
    // SAFETY: as above.
    let rc = unsafe { ferry_checkpoint_load(path.as_ptr(), null_mut(), 3, null(), null_mut()) };
    assert_eq!((rc, last()), (-FERRY_EINVAL, "tensors is NULL".to_string()));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn saves_refuse_bad_tensors_and_leave_nothing() {
    let dir = tmp("bad-save");
    let mut m = Model::new(2);
    let path = c_path(&dir.join("m.safetensors"));
    let mut ts = m.tensors();
    ts[0].buf.len = 100;
    assert_eq!(save(&path, &ts, None), -FERRY_EINVAL);
    assert!(last().contains("`w`"), "{}", last());
    let mut ts = m.tensors();
    ts[1].name = c"w".as_ptr();
    assert_eq!(save(&path, &ts, None), -FERRY_EINVAL);
    assert!(last().contains("twice"), "{}", last());
    let mut ts = m.tensors();
    ts[0].shape = null();
    assert_eq!(save(&path, &ts, None), -FERRY_EINVAL);
    assert!(last().contains("shape is NULL"), "{}", last());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // An empty tensor saves and loads (its pointer may be NULL).
    let shape = [0usize, 4];
    let empty = FerryTensor {
        name: c"e".as_ptr(),
        dtype: FERRY_DTYPE_F32,
        ndims: 2,
        shape: shape.as_ptr(),
        buf: FerryBuffer {
            ptr: null_mut(),
            len: 0,
            kind: FERRY_MEM_PAGEABLE,
            device: 0,
        },
    };
    assert_eq!(save(&path, &[empty], None), FERRY_SUCCESS, "{}", last());
    let mut r = FerryCheckpointReport::default();
    assert_eq!(
        load(&path, &mut [empty], &mut r),
        FERRY_SUCCESS,
        "{}",
        last()
    );
    assert_eq!((r.tensors, r.bytes), (1, 0));
    std::fs::remove_dir_all(&dir).ok();
}
