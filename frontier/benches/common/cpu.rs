//! CPU time a process has used, read from `/proc/self/stat` (Linux, in
//! clock ticks of 1/100 s), so that a run shows what its work costs apart
//! from how busy the VM's host is.

/// Whose CPU time [`cpu_seconds`] reads.
// A bench that includes this file reads one of the two.
#[allow(dead_code)]
#[derive(Clone, Copy)]
pub enum Whose {
    /// This process's own threads (`utime + stime`).
    Own,
    /// This process's children it has waited for (`cutime + cstime`).
    WaitedChildren,
}

/// User + system CPU seconds so far; 0 where `/proc` cannot be read.
pub fn cpu_seconds(whose: Whose) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // After the command name: state is field 3; utime, stime, cutime and
    // cstime are fields 14 to 17.
    let ticks = |field: usize| -> f64 {
        fields
            .get(field - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let (user, system) = match whose {
        Whose::Own => (14, 15),
        Whose::WaitedChildren => (16, 17),
    };
    (ticks(user) + ticks(system)) / 100.0
}
