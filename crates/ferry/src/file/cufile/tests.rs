use super::driver::register_hint;
use super::sys::result;
use crate::file::CuFileCode;
use cudarc::cufile::sys as cf;

#[test]
fn codes_are_named_and_raw_values_kept() {
    let c = CuFileCode::Op {
        code: 5008,
        cuda: 0,
    };
    assert_eq!(
        c.op_error(),
        Some(cf::CUfileOpError::CU_FILE_IO_NOT_SUPPORTED)
    );
    assert_eq!(c.to_string(), "CU_FILE_IO_NOT_SUPPORTED (5008)");
    let c = CuFileCode::Op {
        code: 5011,
        cuda: 700,
    };
    assert!(c.to_string().ends_with("(5011), CUresult 700"), "{c}");
    let c = CuFileCode::Op {
        code: 9999,
        cuda: 0,
    };
    assert_eq!(
        (c.op_error(), c.to_string()),
        (None, "CUfileOpError 9999".into())
    );
    let c = CuFileCode::Os { errno: libc::EIO };
    assert!(c.to_string().starts_with("errno 5: "), "{c}");
    assert_eq!(result(4096), Ok(4096));
    assert_eq!(
        result(-5008),
        Err(CuFileCode::Op {
            code: 5008,
            cuda: 0
        })
    );
}

#[test]
fn a_refused_registration_names_the_likely_cause() {
    assert!(register_hint(true, true).is_some_and(|h| h.contains("unlinked")));
    assert!(register_hint(true, false).is_some_and(|h| h.contains("unlinked")));
    assert!(register_hint(false, false).is_some_and(|h| h.contains("/run/udev/data")));
    assert_eq!(register_hint(false, true), None);
}
