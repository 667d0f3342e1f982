// Functions and methods: every key of the function form.
use safemlx::Stream;
use safemlx_dist::{sharded, Mesh, Partial, Replicated, Sharded, ShardedArray};

#[sharded(mesh = mesh, stream = s, x: [T, D = 4096] @ Replicated, w: [D = 4096, H] @ Sharded<1>, return: [T, H] @ Replicated)]
fn column(
    mesh: &Mesh<4>,
    x: ShardedArray<Sharded<0>, Mesh<4>>,
    w: &ShardedArray<Sharded<1>, Mesh<4>>,
    s: &Stream,
) -> safemlx_dist::Result<ShardedArray<Replicated, Mesh<4>>> {
    let _ = mesh;
    x.matmul(w, s)
}

struct Row {
    w: ShardedArray<Sharded<0>>,
}

impl Row {
    #[sharded(h @ Sharded<1>, return @ Sharded<0>)]
    fn forward(&self, h: ShardedArray<Sharded<1>>, s: &Stream) -> safemlx_dist::Result<ShardedArray<Sharded<0>>> {
        let partial: ShardedArray<Partial> = h.matmul(&self.w, s)?;
        Ok(partial)
    }
}

fn main() {
    let _ = (column, Row::forward);
}
