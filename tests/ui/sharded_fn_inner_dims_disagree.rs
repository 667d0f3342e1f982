use safemlx::Stream;
use safemlx_dist::{sharded, Replicated, Sharded, ShardedArray};

// x's columns and w's rows are the same dimension `D`, declared twice.
#[sharded(x: [T, D = 4096] @ Replicated, w: [D = 4095, H] @ Sharded<1>)]
fn up(x: ShardedArray<Replicated>, w: &ShardedArray<Sharded<1>>, s: &Stream) -> safemlx_dist::Result<ShardedArray<Sharded<1>>> {
    x.matmul(w, s)
}

fn main() {}
