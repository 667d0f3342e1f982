use safemlx::Stream;
use safemlx_dist::{sharded, Mesh, Ragged, ShardedArray};

// Four ranks, three counts: the routing plan does not compile.
#[sharded(mesh = mesh, route(tokens, counts))]
fn experts(
    mesh: &Mesh<4>,
    tokens: ShardedArray<Ragged, Mesh<4>>,
    counts: [usize; 3],
    s: &Stream,
) -> safemlx_dist::Result<ShardedArray<Ragged, Mesh<4>>> {
    let _ = mesh;
    Ok(tokens)
}

fn main() {}
