//! The environment variables a backend sets in this process.
//!
//! MLX's MPI backend initialises Open MPI even in a process that no
//! `mpirun` started (a singleton), and Open MPI then sets `PMIX_*`,
//! `OMPI_MCA_*` and `ORTE_*` variables in this process's environment. A
//! child inheriting them believes it is a rank of that singleton: an
//! `mpirun` started from here exits 1 without a word, and a rank would
//! try to join the parent's PMIx server. So [`Group::init`] records what
//! the native init changed, and the launcher starts its children with the
//! environment as it was before.
//!
//! [`Group::init`]: super::Group::init

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Command;
use std::sync::Mutex;

/// Variables the native init added or changed, with their earlier values.
static CHANGED: Mutex<BTreeMap<OsString, Option<OsString>>> = Mutex::new(BTreeMap::new());

/// Runs `init` and records what it changed in the environment (the first
/// value seen before any init is kept when inits repeat).
pub(crate) fn recording<T>(init: impl FnOnce() -> T) -> T {
    let before: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    let result = init();
    let mut changed = CHANGED.lock().unwrap_or_else(|e| e.into_inner());
    for (key, value) in std::env::vars_os() {
        if before.get(&key) != Some(&value) {
            changed
                .entry(key.clone())
                .or_insert_with(|| before.get(&key).cloned());
        }
    }
    result
}

/// Gives `command` the environment as it was before any backend changed it.
pub(crate) fn restore_for_child(command: &mut Command) {
    let changed = CHANGED.lock().unwrap_or_else(|e| e.into_inner());
    for (key, earlier) in changed.iter() {
        match earlier {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
}
