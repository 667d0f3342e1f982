// A partial sum over the tensor-parallel axis has its terms on the tp
// ranks: summing it over the data-parallel axis would add the wrong
// arrays. Name the array's own axis: `all_sum_over::<Tp>()`.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, Tp};
use safemlx_dist::{Partial, ShardedArray};

fn reduce(x: ShardedArray<Partial, Axis<Tp, 2>>, s: &Stream) {
    let _ = x.all_sum_over::<Dp>(s);
}

fn main() {}
