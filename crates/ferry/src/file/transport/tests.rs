use super::*;

fn device(mode: CuFileMode, libcufile: bool, nvidia_fs: bool) -> Facts {
    Facts::new(mode, true, libcufile, nvidia_fs)
}

#[test]
fn host_memory_is_the_workers_whatever_the_mode() {
    for mode in [CuFileMode::Auto, CuFileMode::On, CuFileMode::Off] {
        let c = choose(&Facts::new(mode, false, true, true));
        assert_eq!(c.transport, Transport::Host, "{mode}: {c}");
    }
}

#[test]
fn off_never_uses_cufile() {
    let c = choose(&device(CuFileMode::Off, true, true));
    assert_eq!(c.transport, Transport::BounceRing);
    assert!(c.reason.contains("FERRY_CUFILE=off"), "{c}");
}

#[test]
fn auto_uses_cufile_only_with_nvidia_fs() {
    let c = choose(&device(CuFileMode::Auto, true, true));
    assert_eq!(c.transport, Transport::CuFile { compat: false }, "{c}");
    let c = choose(&device(CuFileMode::Auto, true, false));
    assert_eq!(c.transport, Transport::BounceRing);
    assert_eq!(c.reason, NO_NVIDIA_FS);
    // The library is the first missing piece named.
    let c = choose(&device(CuFileMode::Auto, false, false));
    assert_eq!(c.transport, Transport::BounceRing);
    assert!(c.reason.contains("libcufile"), "{c}");
}

#[test]
fn on_uses_compat_mode_without_nvidia_fs() {
    let c = choose(&device(CuFileMode::On, true, false));
    assert_eq!(c.transport, Transport::CuFile { compat: true }, "{c}");
    assert!(c.reason.contains("compatibility mode"), "{c}");
    assert!(c.reason.contains("FERRY_CUFILE=on"), "{c}");
    let c = choose(&device(CuFileMode::On, true, true));
    assert_eq!(c.transport, Transport::CuFile { compat: false }, "{c}");
    let c = choose(&device(CuFileMode::On, false, true));
    assert_eq!(c.transport, Transport::BounceRing, "{c}");
}

#[test]
fn each_failed_step_falls_back_with_its_reason_in_order() {
    let mut f = device(CuFileMode::On, true, false);
    f.registered = Err("CU_FILE_IO_NOT_SUPPORTED (5008)".into());
    let c = choose(&f);
    assert_eq!(c.transport, Transport::BounceRing);
    assert!(
        c.reason.contains("cuFileHandleRegister") && c.reason.contains("5008"),
        "{c}"
    );
    f.direct = Err("Invalid argument (os error 22)".into());
    let c = choose(&f);
    assert!(
        c.reason.contains("O_DIRECT") && c.reason.contains("os error 22"),
        "{c}"
    );
    f.driver = Err("cuFileDriverOpen failed: CU_FILE_NVFS_DRIVER_ERROR (5010)".into());
    let c = choose(&f);
    assert!(c.reason.starts_with("cuFile's driver did not open"), "{c}");
    f.aligned = false;
    let c = choose(&f);
    assert!(c.reason.contains("not a multiple of 4096"), "{c}");
    // Auto without nvidia-fs never gets as far as trying.
    f.mode = CuFileMode::Auto;
    assert_eq!(choose(&f).reason, NO_NVIDIA_FS);
    f.mode = CuFileMode::Off;
    assert!(choose(&f).reason.contains("off"));
}

#[test]
fn modes_parse_and_print() {
    for (s, m) in [
        ("auto", CuFileMode::Auto),
        ("ON", CuFileMode::On),
        (" off ", CuFileMode::Off),
    ] {
        assert_eq!(s.parse::<CuFileMode>(), Ok(m));
        assert_eq!(m.to_string().parse::<CuFileMode>(), Ok(m));
    }
    assert!("yes".parse::<CuFileMode>().is_err());
    assert_eq!(CuFileMode::default(), CuFileMode::Auto);
    assert_eq!(
        Transport::CuFile { compat: true }.to_string(),
        "cuFile (compatibility mode)"
    );
}
