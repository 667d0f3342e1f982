// An unreduced partial sum cannot cross a pipeline stage boundary: the
// next stage would take it for the activation. Reduce it first
// (`redistribute::<Replicated>()`, an all_sum).
use safemlx::Stream;
use safemlx_dist::typed::StageLink;
use safemlx_dist::{Partial, ShardedArray};

fn send(link: &StageLink, x: &ShardedArray<Partial>, s: &Stream) {
    let _ = link.send_hidden(x, true, s);
}

fn main() {}
