//! A process that is itself an MPI singleton (it called `init` with MPI
//! available but no `mpirun` around it) still launches ranks: Open MPI's
//! `PMIX_*`/`OMPI_MCA_*` variables of the singleton do not reach them.
//! Without that, `mpirun` exits 1 without a word. In its own binary, since
//! the singleton changes this whole process's environment.

use safemlx_dist::launch::{Ranks, RANK_OF_ENV};
use safemlx_dist::{all_sum, Backend};
use safemlx_dist_tests::{array, check_every_collective, cpu, read};

/// A variable Open MPI's singleton sets (`OMPI_MCA_ess=singleton`).
const SINGLETON_MARK: &str = "OMPI_MCA_ess";

#[test]
fn ranks_launched_from_an_mpi_singleton_run_on_mpi_and_ring() {
    if std::env::var_os(RANK_OF_ENV).is_none() {
        let parent = safemlx_dist::init(false, Backend::Mpi).expect("singleton");
        assert_eq!(parent.size(), 1);
        assert_eq!(
            std::env::var(SINGLETON_MARK).as_deref(),
            Ok("singleton"),
            "this test needs the MPI backend's singleton (Open MPI)"
        );
    }
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(check_every_collective)
        .unwrap_or_else(|e| panic!("2 MPI ranks from a singleton: {e}"));
    Ranks::new(2)
        .backend(Backend::Ring)
        .run_test(|group| {
            assert_eq!(std::env::var_os(SINGLETON_MARK), None);
            let s = cpu();
            let x = array(&[group.rank() as i32 + 1], &[1], safemlx::Dtype::Int32, &s);
            let sum = all_sum(&x, group, &s).expect("all_sum");
            assert_eq!(read(&sum, safemlx::Dtype::Int32, &s), [3]);
        })
        .unwrap_or_else(|e| panic!("2 ring ranks from a singleton: {e}"));
}
