//! The multiplex DMA (`aml/dma/multiplex.h`): requests spread over other dmas by integer
//! weight. As AML it does not own the dmas (destroy them yourself, after it); unlike AML the
//! same dma may appear twice, a weight of 0 sends that dma nothing (at least one weight must be
//! positive), the choice is thread-safe, and a NULL `aml_dma_multiplex_request_args` (the
//! `aml_dma_copy` macros) uses each dma's default operator.

use crate::dma::{aml_dma_async_copy_custom, aml_dma_barrier, aml_dma_cancel, aml_dma_wait};
use crate::dma::{destroy_dma, AmlDma, AmlDmaOperator, AmlDmaOps};
use crate::error::{fail, guard, inval, AML_ENOMEM, AML_SUCCESS};
use crate::layout::AmlLayout;
use ferry_capi::Fail;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, PoisonError};

const MAGIC: u64 = 0x616d_6c5f_6d75_7831; // "aml_mux1"

/// `struct aml_dma_multiplex_data`, AML's public fields first, then this library's.
#[repr(C)]
pub struct AmlDmaMultiplexData {
    /// Number of dmas.
    pub count: usize,
    /// The dma the next request goes to.
    pub index: usize,
    /// Requests already sent to it in this turn.
    pub round: usize,
    /// The dmas (not owned).
    pub dmas: *mut *mut AmlDma,
    /// Their weights.
    pub weights: *mut usize,
    magic: u64,
    /// (index, round) of the weighted turn (AML's `index`/`round` fields are not updated).
    turn: Mutex<(usize, usize)>,
    own_dmas: Vec<*mut AmlDma>,
    own_weights: Vec<usize>,
}

/// `struct aml_dma_multiplex_request`: the inner requests and their dmas.
#[repr(C)]
pub struct AmlDmaMultiplexRequest {
    /// Number of inner requests.
    pub count: usize,
    /// The inner requests.
    pub reqs: *mut *mut c_void,
    /// The dma of each.
    pub dmas: *mut *mut AmlDma,
}

/// `struct aml_dma_multiplex_request_args`: the operator and argument to use on each dma (the
/// arrays as long as the dma array; either may be NULL: the dmas' defaults).
#[repr(C)]
pub struct AmlDmaMultiplexRequestArgs {
    /// One operator per dma.
    pub ops: *mut AmlDmaOperator,
    /// One argument per dma.
    pub op_args: *mut *mut c_void,
}

/// `struct aml_dma_multiplex_copy_args`: what the multiplex passes to its operators.
#[repr(C)]
pub struct AmlDmaMultiplexCopyArgs {
    /// The multiplex.
    pub m_data: *mut AmlDmaMultiplexData,
    /// Where the operator stores the request (NULL: no request wanted).
    pub m_req: *mut *mut AmlDmaMultiplexRequest,
    /// The caller's `op_arg`.
    pub args: *mut AmlDmaMultiplexRequestArgs,
}

/// The methods of the multiplex DMA.
#[no_mangle]
pub static aml_dma_multiplex_ops: AmlDmaOps = AmlDmaOps {
    create_request: Some(aml_dma_multiplex_request_create),
    destroy_request: Some(aml_dma_multiplex_request_destroy),
    wait_request: Some(aml_dma_multiplex_request_wait),
    barrier: Some(aml_dma_multiplex_barrier),
    fprintf: Some(mux_fprintf),
};

/// # Safety
/// 1. `data` is NULL or a multiplex's data not yet destroyed.
unsafe fn mux<'a>(data: *const c_void) -> Result<&'a AmlDmaMultiplexData, Fail> {
    // SAFETY: (1).
    let m = unsafe { data.cast::<AmlDmaMultiplexData>().as_ref() }
        .ok_or_else(|| inval("dma data is NULL"))?;
    if m.magic != MAGIC {
        return Err(inval(
            "not a multiplex dma (destroyed, or another dma type)",
        ));
    }
    Ok(m)
}

/// Creates a multiplex over `num` dmas (not owned; the same one may appear twice) with
/// integer `weights` (NULL: all 1; 0: that dma gets nothing). `-AML_EINVAL`: NULL dma or
/// dmas, `num` 0, a NULL dma in the array, every weight 0.
///
/// # Safety
/// 1. `dma` is NULL or valid for one write; `dmas` NULL or valid for `num` reads, each a dma
///    that outlives the multiplex; `weights` NULL or valid for `num` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_create(
    dma: *mut *mut AmlDma,
    num: usize,
    dmas: *const *const AmlDma,
    weights: *const usize,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let out = unsafe { dma.as_mut() }.ok_or_else(|| inval("dma is NULL"))?;
        if num == 0 || dmas.is_null() {
            return Err(inval("num is 0 or dmas is NULL"));
        }
        // SAFETY: (1).
        let list: Vec<*mut AmlDma> = unsafe { std::slice::from_raw_parts(dmas, num) }
            .iter()
            .map(|d| d.cast_mut())
            .collect();
        if let Some(i) = list.iter().position(|d| d.is_null()) {
            return Err(inval(format!("dmas[{i}] is NULL")));
        }
        let w = if weights.is_null() {
            vec![1; num]
        } else {
            // SAFETY: (1).
            unsafe { std::slice::from_raw_parts(weights, num) }.to_vec()
        };
        if w.iter().all(|&x| x == 0) {
            return Err(inval("every weight is 0"));
        }
        let mut data = Box::new(AmlDmaMultiplexData {
            count: num,
            index: 0,
            round: 0,
            dmas: std::ptr::null_mut(),
            weights: std::ptr::null_mut(),
            magic: MAGIC,
            turn: Mutex::new((0, 0)),
            own_dmas: list,
            own_weights: w,
        });
        data.dmas = data.own_dmas.as_mut_ptr();
        data.weights = data.own_weights.as_mut_ptr();
        *out = Box::into_raw(Box::new(AmlDma {
            ops: &aml_dma_multiplex_ops,
            data: Box::into_raw(data).cast(),
        }));
        Ok(AML_SUCCESS)
    })
}

/// Frees a multiplex (not its dmas, not their requests) and sets `*dma` to NULL.
///
/// # Safety
/// 1. `dma` is NULL or valid; `*dma` NULL or a multiplex not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_destroy(dma: *mut *mut AmlDma) -> c_int {
    // SAFETY: (1): a multiplex's data is a `Box<AmlDmaMultiplexData>`.
    unsafe {
        destroy_dma(
            dma,
            |data| mux(data).map(|_| ()),
            |m: &mut AmlDmaMultiplexData| m.magic = 0,
        )
    }
}

/// Submits a request through `op` (NULL: `aml_dma_multiplex_copy_single`), which gets an
/// `aml_dma_multiplex_copy_args` with `op_arg` (an `aml_dma_multiplex_request_args`, or NULL).
///
/// # Safety
/// 1. `data` is NULL or a multiplex's data; `req` NULL or valid for one write; the rest as
///    `aml_dma_async_copy_custom` on the chosen dma.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_request_create(
    data: *mut c_void,
    req: *mut *mut c_void,
    dest: *mut AmlLayout,
    src: *mut AmlLayout,
    op: AmlDmaOperator,
    op_arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        unsafe { mux(data) }?;
        let op = op.unwrap_or(aml_dma_multiplex_copy_single);
        let mut m_req: *mut AmlDmaMultiplexRequest = std::ptr::null_mut();
        let mut args = AmlDmaMultiplexCopyArgs {
            m_data: data.cast(),
            m_req: if req.is_null() {
                std::ptr::null_mut()
            } else {
                &mut m_req
            },
            args: op_arg.cast(),
        };
        // SAFETY: (1): the operator's contract.
        let rc = unsafe {
            op(
                dest,
                src,
                (&mut args as *mut AmlDmaMultiplexCopyArgs).cast(),
            )
        };
        // SAFETY: (1).
        if let Some(r) = unsafe { req.as_mut() } {
            *r = m_req.cast();
            if !m_req.is_null() {
                live_insert(m_req as usize);
            }
        }
        Ok(rc)
    })
}

/// The multiplex requests handed out and not yet waited or destroyed, by address: a request
/// of another dma given to the multiplex's wait (or destroy) is refused with `-AML_EINVAL`
/// instead of being read as a multiplex request (it was, and its garbage `count` crashed).
/// A hash set (a program may have many requests pending), dropped whenever it empties: a
/// static table kept at exit counted as "possibly lost" in valgrind's leak check.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live_insert(req: usize) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.get_or_insert_with(HashSet::new).insert(req);
}

/// Removes `req` from [`LIVE`]; false if it was not there.
fn live_remove(req: usize) -> bool {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let found = live.as_mut().is_some_and(|set| set.remove(&req));
    if live.as_ref().is_some_and(HashSet::is_empty) {
        *live = None;
    }
    found
}

/// AML's multiplex operator: sends the copy to the next dma by weight, with that dma's
/// operator and argument from the request args (NULL: its defaults).
///
/// # Safety
/// 1. `arg` is the `aml_dma_multiplex_copy_args` of `aml_dma_multiplex_request_create`.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_copy_single(
    dst: *mut AmlLayout,
    src: *const AmlLayout,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let a = unsafe { arg.cast::<AmlDmaMultiplexCopyArgs>().as_ref() }
            .ok_or_else(|| inval("arg is NULL"))?;
        // SAFETY: (1).
        let m = unsafe { mux(a.m_data.cast()) }?;
        let i = {
            let mut t = m.turn.lock().unwrap_or_else(PoisonError::into_inner);
            let (index, round) = &mut *t;
            while *round >= m.own_weights[*index] {
                *index = (*index + 1) % m.count;
                *round = 0;
            }
            *round += 1;
            *index
        };
        let dma = m.own_dmas[i];
        // SAFETY: (1): arrays as long as the dma array, each NULL or valid.
        let (op, op_arg) = unsafe {
            match a.args.as_ref() {
                None => (None, std::ptr::null_mut()),
                Some(r) => (
                    r.ops.as_ref().and_then(|_| *r.ops.add(i)),
                    if r.op_args.is_null() {
                        std::ptr::null_mut()
                    } else {
                        *r.op_args.add(i)
                    },
                ),
            }
        };
        let mut inner: *mut *mut c_void = std::ptr::null_mut();
        let mut block: *mut AmlDmaMultiplexRequest = std::ptr::null_mut();
        if !a.m_req.is_null() {
            block = alloc_request(dma)?;
            // SAFETY: just allocated with room for one request.
            inner = unsafe { (*block).reqs };
        }
        // SAFETY: (1): the caller's layouts and operator, for the chosen dma.
        let rc = unsafe { aml_dma_async_copy_custom(dma, inner, dst, src.cast_mut(), op, op_arg) };
        if !block.is_null() {
            if rc == AML_SUCCESS {
                // SAFETY: (1): `m_req` is valid for one write.
                unsafe { *a.m_req = block };
            } else {
                // SAFETY: allocated above, not handed out.
                unsafe { libc::free(block.cast()) };
            }
        }
        Ok(rc)
    })
}

/// A request of one inner request, in one `malloc` block (as AML, released with `free`).
fn alloc_request(dma: *mut AmlDma) -> Result<*mut AmlDmaMultiplexRequest, Fail> {
    let head = std::mem::size_of::<AmlDmaMultiplexRequest>();
    // SAFETY: malloc of a non-zero size, checked below.
    let p = unsafe { libc::malloc(head + 2 * std::mem::size_of::<*mut c_void>()) }.cast::<u8>();
    if p.is_null() {
        return Err(fail(AML_ENOMEM, "malloc failed"));
    }
    // SAFETY: `p` holds the header and two pointers, pointer-aligned.
    unsafe {
        let reqs = p.add(head).cast::<*mut c_void>();
        *reqs = std::ptr::null_mut();
        let dmas = reqs.add(1).cast::<*mut AmlDma>();
        *dmas = dma;
        let r = p.cast::<AmlDmaMultiplexRequest>();
        r.write(AmlDmaMultiplexRequest {
            count: 1,
            reqs,
            dmas,
        });
        Ok(r)
    }
}

/// Runs `f` on each inner request of `*req`, frees it and sets `*req` to NULL: the first error.
///
/// # Safety
/// 1. `data` is NULL or a multiplex's data; `req` NULL or valid; `*req` NULL or a multiplex
///    request (malloc'd) not yet released.
unsafe fn each(
    data: *mut c_void,
    req: *mut *mut c_void,
    f: unsafe extern "C" fn(*mut AmlDma, *mut *mut c_void) -> c_int,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        unsafe { mux(data) }?;
        // SAFETY: (1).
        let slot = unsafe { req.as_mut() }.ok_or_else(|| inval("req is NULL"))?;
        if slot.is_null() {
            return Err(inval("*req is NULL"));
        }
        if !live_remove(*slot as usize) {
            return Err(inval(
                "*req is not a pending request of a multiplex dma (another dma's, or released)",
            ));
        }
        // SAFETY: (1), and it was handed out by `aml_dma_multiplex_request_create`.
        let r = unsafe { slot.cast::<AmlDmaMultiplexRequest>().as_ref() }
            .ok_or_else(|| inval("*req is NULL"))?;
        let mut first = AML_SUCCESS;
        for i in 0..r.count {
            // SAFETY: (1): `count` entries each.
            let rc = unsafe { f(*r.dmas.add(i), r.reqs.add(i)) };
            if first == AML_SUCCESS {
                first = rc;
            }
        }
        // SAFETY: (1).
        unsafe { libc::free(slot.cast()) };
        *slot = std::ptr::null_mut();
        Ok(first)
    })
}

/// Waits for each inner request and releases the request: the first error, or `AML_SUCCESS`.
///
/// # Safety
/// As `each`: `dma` a multiplex's data, `*req` one of its requests.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_request_wait(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { each(dma, req, aml_dma_wait) }
}

/// Cancels each inner request and releases the request.
///
/// # Safety
/// As [`aml_dma_multiplex_request_wait`].
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_request_destroy(
    dma: *mut c_void,
    req: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { each(dma, req, aml_dma_cancel) }
}

/// Barrier on each distinct dma: the first error, or `AML_SUCCESS`.
///
/// # Safety
/// 1. `dma` is NULL or a multiplex's data whose dmas are alive.
#[no_mangle]
pub unsafe extern "C" fn aml_dma_multiplex_barrier(dma: *mut c_void) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let m = unsafe { mux(dma) }?;
        let mut first = AML_SUCCESS;
        for (i, &d) in m.own_dmas.iter().enumerate() {
            if m.own_dmas[..i].contains(&d) {
                continue;
            }
            // SAFETY: (1).
            let rc = unsafe { aml_dma_barrier(d) };
            if first == AML_SUCCESS {
                first = rc;
            }
        }
        Ok(first)
    })
}

/// # Safety
/// 1. `data` a multiplex's data; `stream` a valid `FILE *`; `prefix` a C string.
unsafe extern "C" fn mux_fprintf(
    data: *const c_void,
    stream: *mut libc::FILE,
    prefix: *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let m = unsafe { mux(data) }?;
        let lines = [
            format!("dma-multiplex: {data:p}"),
            format!("dmas: {}", m.count),
            format!("weights: {:?}", m.own_weights),
        ];
        // SAFETY: (1).
        unsafe { crate::dma::print_lines(stream, prefix, &lines) }
    })
}
