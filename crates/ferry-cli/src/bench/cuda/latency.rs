//! `cuda-latency*`: submit+wait of one small pinned -> device copy, host clock.

use super::CudaBench;
use crate::bench::ctx::{flat, setup, Ctx};
use crate::bench::data::pattern_bytes;
use crate::bench::{BenchError, Role, Row};
use ferry::cuda::{CudaEngine, DeviceBuffer, PinnedBuffer};
use ferry::{Engine, EngineExt, Layout};

impl CudaBench {
    /// Submit+wait of one copy through `engine` (its series named `ferry NAME{wait}`): host
    /// clock (the wait is what is measured).
    pub(super) fn latency(
        &self,
        ctx: &Ctx,
        size: usize,
        engine: &CudaEngine,
        wait: &str,
    ) -> Result<Row, BenchError> {
        let mut src = PinnedBuffer::new(size).map_err(setup)?;
        let data = pattern_bytes(size);
        src.copy_from_slice(&data);
        let mut dev = DeviceBuffer::new(0, size).map_err(setup)?;
        let l = Layout::bytes(size).map_err(setup)?;
        let name = format!("ferry {}{wait}", engine.name());
        let n = size as u64;
        let f = self.dev_series(ctx, None, &name, Role::Ferry, n, &mut dev, &data, |d, _| {
            flat(engine.scope(|s| s.copy(d, &l, &src, &l)?.wait().map_err(ferry::Error::from)))
                .map(|()| None)
        })?;
        let raw = "cuMemcpyAsync + cuStreamSynchronize";
        let r = self.dev_series(
            ctx,
            None,
            raw,
            Role::Baseline,
            n,
            &mut dev,
            &data,
            |d, _| {
                self.raw
                    .copy(d, &src, size, 1)
                    .map_err(|e| e.to_string())
                    .map(|()| None)
            },
        )?;
        Ok(Row::new(
            ctx.test,
            ctx.kind,
            size as u64,
            size as u64,
            "pinned -> device".into(),
            vec![f, r],
        ))
    }
}
