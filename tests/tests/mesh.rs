//! Every collective on every axis of 1x2, 2x1, 2x2, 1x3 and 3x1 meshes,
//! between real processes on ring and MPI, and of 2x3 and 3x2 meshes on
//! ring, whose first axis has subgroups that are not ring neighbours
//! (relayed through the world's `all_to_all_v`): each rank's data depends
//! on its world rank, so a value from another subgroup shows; the
//! subgroups of an axis run at once, and on a `2 x 2` mesh one of them
//! runs an extra collective the other does not (subgroups of neighbours
//! are independent, as a pipeline's stages need).

use safemlx::Dtype;
use safemlx_dist::launch::Ranks;
use safemlx_dist::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, mesh_coords, recv, send, sum_scatter,
    Backend, DeviceMesh, Group,
};
use safemlx_dist_tests::{array, cpu, read};

const MESHES: [[usize; 2]; 5] = [[1, 2], [2, 1], [2, 2], [1, 3], [3, 1]];

/// The world ranks of `world_rank`'s subgroup along `axis`, by their
/// coordinate there, from the coordinates every rank reports.
fn members(table: &[Vec<usize>], world_rank: usize, axis: usize) -> Vec<usize> {
    let mine = &table[world_rank];
    let mut members: Vec<usize> = (0..table.len())
        .filter(|&w| (0..mine.len()).all(|a| a == axis || table[w][a] == mine[a]))
        .collect();
    members.sort_by_key(|&w| table[w][axis]);
    members
}

fn check_mesh(world: &Group, sizes: [usize; 2]) {
    let s = cpu();
    let mesh = DeviceMesh::new(world, &[("pp", sizes[0]), ("tp", sizes[1])]).expect("mesh");
    let w = world.rank();
    // Every rank's coordinates, gathered over the world: each rank has the
    // ones `mesh_coords` gives, and no two ranks share them.
    let mine: Vec<i32> = mesh.coords().iter().map(|&c| c as i32).collect();
    let all = all_gather(&array(&mine, &[1, 2], Dtype::Int32, &s), world, &s).unwrap();
    let flat = read(&all, Dtype::Int32, &s);
    let table: Vec<Vec<usize>> = flat
        .chunks(2)
        .map(|c| vec![c[0] as usize, c[1] as usize])
        .collect();
    for (r, coords) in table.iter().enumerate() {
        assert_eq!(*coords, mesh_coords(r, &sizes), "{sizes:?}: rank {r}");
        assert!(coords.iter().zip(sizes).all(|(c, n)| *c < n));
        assert_eq!(table.iter().filter(|t| *t == coords).count(), 1);
    }
    for (axis, name) in ["pp", "tp"].into_iter().enumerate() {
        let group = mesh.axis(name).unwrap();
        let members = members(&table, w, axis);
        let what = format!("mesh {sizes:?}, axis {name}, world rank {w}, members {members:?}");
        assert_eq!(group.size(), sizes[axis], "{what}");
        // How the subgroup carries collectives.
        let route = match (group.size(), world.backend()) {
            (1, _) => "local",
            (k, _) if k == world.size() => "mlx",
            (_, Backend::Mpi) => "mlx",
            _ if axis == 0 && sizes[0] * sizes[1] > 4 => "relay",
            _ => "chain",
        };
        assert_eq!(group.route(), route, "{what}");
        assert_eq!(group.rank(), mesh.coord(name).unwrap(), "{what}");
        assert_eq!(members[group.rank()], w, "{what}");
        for dtype in [Dtype::Float32, Dtype::Int32] {
            check_axis(group, &members, (w, world.size()), dtype, &what);
        }
        if sizes == [2, 2] && name == "tp" && mesh.coord("pp").unwrap() == 0 {
            // Only stage 0's subgroup: the other one is not waiting for it.
            check_axis(group, &members, (w, world.size()), Dtype::Float32, &what);
        }
    }
    assert_eq!(
        mesh.axis("dp").unwrap_err().to_string(),
        format!(
            "the mesh has no axis `dp`; its axes are pp={},tp={}",
            sizes[0], sizes[1]
        )
    );
}

/// The collectives of one subgroup against values computed from its
/// members' world ranks.
fn check_axis(group: &Group, members: &[usize], (w, n): (usize, usize), dtype: Dtype, what: &str) {
    let s = cpu();
    let (r, k) = (group.rank(), group.size());
    let value = |world: usize, i: usize| ((world + 1) * 10 + i) as i32;
    let x: Vec<i32> = (0..2 * k).map(|i| value(w, i)).collect();
    let input = array(&x, &[2 * k as i32], dtype, &s);
    let fold = |f: fn(i32, i32) -> i32| -> Vec<i32> {
        (0..2 * k)
            .map(|i| members.iter().map(|&m| value(m, i)).reduce(f).unwrap())
            .collect()
    };
    let got = read(&all_sum(&input, group, &s).unwrap(), dtype, &s);
    assert_eq!(got, fold(|a, b| a + b), "{what}: all_sum {dtype:?}");
    let got = read(&all_max(&input, group, &s).unwrap(), dtype, &s);
    assert_eq!(got, fold(i32::max), "{what}: all_max {dtype:?}");
    let got = read(&all_min(&input, group, &s).unwrap(), dtype, &s);
    assert_eq!(got, fold(i32::min), "{what}: all_min {dtype:?}");

    // all_gather of a [2, 3] block per rank, in subgroup-rank order.
    let block: Vec<i32> = (0..6).map(|j| w as i32 * 10 + j).collect();
    let gathered = all_gather(&array(&block, &[2, 3], dtype, &s), group, &s).unwrap();
    assert_eq!(gathered.shape(), &[2 * k as i32, 3], "{what}");
    let want: Vec<i32> = members
        .iter()
        .flat_map(|&m| (0..6).map(move |j| m as i32 * 10 + j))
        .collect();
    assert_eq!(
        read(&gathered, dtype, &s),
        want,
        "{what}: all_gather {dtype:?}"
    );

    // sum_scatter of [2k, 2]: member r keeps rows 2r and 2r + 1 of the sum.
    let rows: Vec<i32> = (0..4 * k).map(|i| value(w, i)).collect();
    let scattered = sum_scatter(&array(&rows, &[2 * k as i32, 2], dtype, &s), group, &s).unwrap();
    assert_eq!(scattered.shape(), &[2, 2], "{what}");
    let want: Vec<i32> = (4 * r..4 * r + 4)
        .map(|i| members.iter().map(|&m| value(m, i)).sum())
        .collect();
    assert_eq!(
        read(&scattered, dtype, &s),
        want,
        "{what}: sum_scatter {dtype:?}"
    );

    // all_to_all_v: (from + to) % 3 rows from member `from` to member `to`,
    // each row [sender's world rank, destination, index].
    let between = |from: usize, to: usize| (from + to) % 3;
    let sends: Vec<usize> = (0..k).map(|d| between(r, d)).collect();
    let recvs: Vec<usize> = (0..k).map(|src| between(src, r)).collect();
    let row = |from: usize, to: usize, i: usize| [members[from] as i32, to as i32, i as i32];
    let data: Vec<i32> = (0..k)
        .flat_map(|d| (0..sends[d]).flat_map(move |i| row(r, d, i)))
        .collect();
    let total = sends.iter().sum::<usize>() as i32;
    let y = all_to_all_v(
        &array(&data, &[total, 3], dtype, &s),
        &sends,
        &recvs,
        group,
        &s,
    )
    .unwrap();
    let want: Vec<i32> = (0..k)
        .flat_map(|src| (0..recvs[src]).flat_map(move |i| row(src, r, i)))
        .collect();
    assert_eq!(
        y.shape(),
        &[recvs.iter().sum::<usize>() as i32, 3],
        "{what}"
    );
    assert_eq!(read(&y, dtype, &s), want, "{what}: all_to_all_v {dtype:?}");

    // send/recv between the two members of a pair of ring neighbours.
    let neighbours = |a: usize, b: usize| (a + 1) % n == b || (b + 1) % n == a;
    if k == 2 && !neighbours(members[0], members[1]) {
        let error = send(&input, 1 - r, group, &s).unwrap_err().to_string();
        assert!(
            error.contains("MLX's ring reaches only neighbours"),
            "{what}: {error}"
        );
    } else if k == 2 {
        let other = 1 - r;
        let mine = array(&[w as i32, 7], &[2], dtype, &s);
        let sent = send(&mine, other, group, &s).unwrap();
        let got = recv(&[2], dtype, other, group, &s).unwrap();
        let (first, second) = if r == 0 { (&sent, &got) } else { (&got, &sent) };
        safemlx_dist::eval(&[first]).unwrap();
        safemlx_dist::eval(&[second]).unwrap();
        assert_eq!(
            read(&got, dtype, &s),
            [members[other] as i32, 7],
            "{what}: recv"
        );
    }
}

fn on(backend: Backend, meshes: &[[usize; 2]]) {
    for &sizes in meshes {
        Ranks::new(sizes[0] * sizes[1])
            .backend(backend)
            .run_test(|world| check_mesh(world, sizes))
            .unwrap_or_else(|e| panic!("mesh {sizes:?} on {backend}: {e}"));
    }
}

#[test]
fn every_collective_on_every_axis_on_ring() {
    on(Backend::Ring, &MESHES);
}

/// Meshes of 6 ranks (3 of them sharing each core here): on `2 x 3` the
/// first axis pairs ranks 1 and 4, on `3 x 2` it groups 0, 3, 4 and 1, 2, 5.
#[test]
fn relayed_subgroups_on_ring() {
    on(Backend::Ring, &[[2, 3], [3, 2]]);
}

#[test]
fn every_collective_on_every_axis_under_mpi() {
    on(Backend::Mpi, &MESHES);
}
