//! The file engine's whole-file, "up to N bytes" and many-piece calls on the CPU, every byte
//! checked, for buffered, `O_DIRECT` and staged engines.

use ferry::file::{FileConfig, FileEngine, FileError, OpenMode, ReadPiece, WritePiece};
use ferry::memory::{AlignedBuffer, Region};
use std::path::PathBuf;

mod files_common;
use files_common::{bytes, engines, TempDir};

/// A file of `data` in its own temp folder.
struct Temp(PathBuf, #[allow(dead_code)] TempDir);
impl Temp {
    fn new(tag: &str, data: &[u8]) -> Temp {
        let d = TempDir::new(tag);
        Temp(d.file("f", data), d)
    }
}

#[test]
fn read_all_reads_every_byte() {
    for (i, n) in [0usize, 1, 4095, 4096, 1 << 20, (3 << 20) + 17]
        .into_iter()
        .enumerate()
    {
        let data = bytes(n, i as u64);
        let t = Temp::new(&format!("all-{n}"), &data);
        for (name, fe) in engines() {
            let f = fe.open(&t.0, OpenMode::Read).unwrap();
            let (buf, r) = fe.read_all(&f).unwrap();
            assert_eq!(r.bytes, n as u64, "{name} {n}");
            assert!(buf[..] == data[..], "{name}: {n} bytes differ");
        }
    }
}

#[test]
fn load_up_to_reports_the_short_count() {
    let data = bytes(100_000, 7);
    let t = Temp::new("upto", &data);
    for (name, fe) in engines() {
        let f = fe.open(&t.0, OpenMode::Read).unwrap();
        for (off, cap, want) in [
            (0u64, 1000usize, 1000usize),
            (99_000, 4096, 1000),
            (100_000, 10, 0),
            (200_000, 10, 0),
            (0, 200_000, 100_000),
            (5, 0, 0),
        ] {
            let mut buf = AlignedBuffer::new(cap).unwrap();
            let (n, r) = fe.load_up_to(&f, off, &mut buf).unwrap();
            assert_eq!(
                (n, r.bytes),
                (want, want as u64),
                "{name} at {off} up to {cap}"
            );
            let o = (off as usize).min(data.len());
            assert!(buf[..n] == data[o..o + n], "{name} at {off}");
            assert!(
                buf[n..].iter().all(|&b| b == 0),
                "{name}: bytes past the count were written"
            );
        }
    }
}

#[test]
fn pieces_scatter_and_gather() {
    let data = bytes(1 << 20, 3);
    let t = Temp::new("pieces", &data);
    let out = Temp::new("pieces-out", &[]);
    for (name, fe) in engines() {
        let f = fe.open(&t.0, OpenMode::Read).unwrap();
        let mut buf = vec![0u8; 300_000];
        let pieces = [
            ReadPiece {
                file: &f,
                offset: 500_000,
                at: 0,
                len: 100_000,
            },
            ReadPiece {
                file: &f,
                offset: 0,
                at: 100_000,
                len: 150_000,
            },
            ReadPiece {
                file: &f,
                offset: 1_000_000,
                at: 250_000,
                len: 48_576,
            },
            ReadPiece {
                file: &f,
                offset: 7,
                at: 299_000,
                len: 0,
            },
        ];
        let r = fe.load_pieces(&mut buf[..], &pieces).unwrap();
        assert_eq!(r.bytes, 298_576, "{name}");
        assert!(buf[..100_000] == data[500_000..600_000], "{name}");
        assert!(buf[100_000..250_000] == data[..150_000], "{name}");
        assert!(buf[250_000..298_576] == data[1_000_000..], "{name}");
        // Gathered back out in another order.
        let o = fe.open(&out.0, OpenMode::Create).unwrap();
        let a = Region::of(&buf, 0..100_000).unwrap();
        let b = Region::of(&buf, 100_000..250_000).unwrap();
        fe.store_pieces(&[
            WritePiece {
                file: &o,
                offset: 150_000,
                data: &a,
            },
            WritePiece {
                file: &o,
                offset: 0,
                data: &b,
            },
        ])
        .unwrap();
        let back = std::fs::read(&out.0).unwrap();
        assert!(
            back[..150_000] == data[..150_000] && back[150_000..] == data[500_000..600_000],
            "{name}"
        );
    }
}

#[test]
fn bad_pieces_are_refused_before_any_read() {
    let data = bytes(10_000, 4);
    let t = Temp::new("bad-pieces", &data);
    let fe = FileEngine::new(FileConfig::new().threads(2)).unwrap();
    let f = fe.open(&t.0, OpenMode::Read).unwrap();
    let mut buf = [0xAAu8; 100];
    for pieces in [
        vec![ReadPiece {
            file: &f,
            offset: 0,
            at: 90,
            len: 20,
        }],
        vec![
            ReadPiece {
                file: &f,
                offset: 0,
                at: 0,
                len: 50,
            },
            ReadPiece {
                file: &f,
                offset: 0,
                at: 49,
                len: 10,
            },
        ],
        vec![ReadPiece {
            file: &f,
            offset: 0,
            at: usize::MAX,
            len: 2,
        }],
    ] {
        let e = fe.load_pieces(&mut buf[..], &pieces).unwrap_err();
        assert!(matches!(e, FileError::BadRange(_)), "{e}");
        assert!(buf.iter().all(|&b| b == 0xAA));
    }
    // A piece beyond the file fails the call, after the others finished.
    let e = fe
        .load_pieces(
            &mut buf[..],
            &[
                ReadPiece {
                    file: &f,
                    offset: 0,
                    at: 0,
                    len: 50,
                },
                ReadPiece {
                    file: &f,
                    offset: 9_990,
                    at: 50,
                    len: 50,
                },
            ],
        )
        .unwrap_err();
    assert!(
        matches!(e, FileError::OutOfRange { offset: 9_990, .. }),
        "{e}"
    );
}
