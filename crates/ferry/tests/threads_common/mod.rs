//! Thread counts for the leak checks of the file tests (CPU and GPU).

/// ferry's own threads (named `ferry-*`), once the count has held still for 20 ms (at most
/// 2 s): not every thread of the process (the harness's thread of the test before may still be
/// exiting, a test without the lock may be running), and not before new threads have named
/// themselves or finished threads have gone.
pub fn threads_now() -> usize {
    let count = || {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("ferry-"))
                })
                .count()
        })
    };
    let start = std::time::Instant::now();
    let (mut last, mut since) = (count(), std::time::Instant::now());
    while since.elapsed() < std::time::Duration::from_millis(20)
        && start.elapsed() < std::time::Duration::from_secs(2)
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = count();
        if c != last {
            (last, since) = (c, std::time::Instant::now());
        }
    }
    last
}
