//! Test fixture: a real veth pair in this namespace, for the kernel-socket tests (root only).

/// A veth pair, deleted on drop.
pub(crate) struct Veth(String);

impl Veth {
    /// Creates a pair named from `prefix`, `tag` and our pid; returns it and both ends'
    /// names. Without root: None (a skip), or a failure in CI, naming `what` needs root.
    pub(crate) fn new(prefix: &str, tag: &str, what: &str) -> Option<(Veth, String, String)> {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "root needed for {what} tests");
            eprintln!("SKIP: {what} test needs root");
            return None;
        }
        let a = format!("{prefix}{tag}a{}", std::process::id() % 100_000);
        let b = format!("{prefix}{tag}b{}", std::process::id() % 100_000);
        let ok = std::process::Command::new("ip")
            .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip link add {a}");
        Some((Veth(a.clone()), a, b))
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .status();
    }
}
