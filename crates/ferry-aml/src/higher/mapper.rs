//! `aml/higher/mapper.h`: mappers, the description of a C structure (its size, and for each
//! pointer field its offset, element count function and mapper) that the visitor, the deep
//! copy and the replica build walk; `aml_mapper_create` / `destroy` and AML's ready mappers of
//! the C scalar types. The declaration macros are the header's.

use crate::error::{guard, inval, AML_SUCCESS};
use std::ffi::{
    c_char, c_double, c_float, c_int, c_long, c_longlong, c_short, c_uchar, c_uint, c_ulong,
    c_ulonglong, c_ushort, c_void,
};
use std::mem::size_of;

pub mod creator;
pub mod deepcopy;
pub mod ptrs;
pub mod replica;

pub mod visitor;

/// The size of C's `long double` on the targets ferry builds for (x86-64 and AArch64 Linux).
const LONG_DOUBLE: usize = 16;

/// `num_element_fn`: the number of elements of a field, from a pointer to its structure.
pub type NumElementFn = Option<unsafe extern "C" fn(*mut c_void) -> usize>;

/// Allocate apart from the parent in a deep copy.
pub const AML_MAPPER_FLAG_SPLIT: u64 = 0x1;
/// Allocate on the host (implies `AML_MAPPER_FLAG_SPLIT`).
pub const AML_MAPPER_FLAG_HOST: u64 = 0x3;

/// `struct aml_mapper`.
#[repr(C)]
pub struct AmlMapper {
    /// `AML_MAPPER_FLAG_*`.
    pub flags: u64,
    /// The structure's size.
    pub size: usize,
    /// Its pointer fields.
    pub n_fields: usize,
    /// Each field's offset.
    pub offsets: *mut usize,
    /// Each field's element count (a NULL array or entry: one element).
    pub num_elements: *mut NumElementFn,
    /// Each field's mapper.
    pub fields: *mut *mut AmlMapper,
}

// SAFETY: the ready mappers are immutable and point to nothing.
unsafe impl Sync for AmlMapper {}

impl AmlMapper {
    const fn scalar(flags: u64, size: usize) -> Self {
        AmlMapper {
            flags,
            size,
            n_fields: 0,
            offsets: std::ptr::null_mut(),
            num_elements: std::ptr::null_mut(),
            fields: std::ptr::null_mut(),
        }
    }
}

/// A mapper from `aml_mapper_create` and the arrays it points to.
#[repr(C)]
struct Owned {
    mapper: AmlMapper,
    offsets: Vec<usize>,
    num_elements: Option<Vec<NumElementFn>>,
    fields: Vec<*mut AmlMapper>,
}

/// Creates a mapper, copying the arrays (`num_elements` may be NULL: one element each).
/// `-AML_EINVAL` for a NULL `out`, or fields without offsets or mappers.
///
/// # Safety
/// 1. `out` NULL or valid for one write; with `num_fields` > 0, `fields_offset`, `fields` and
///    (unless NULL) `num_elements` NULL or valid for `num_fields` reads.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_create(
    out: *mut *mut AmlMapper,
    flags: u64,
    struct_size: usize,
    num_fields: usize,
    fields_offset: *const usize,
    num_elements: *const NumElementFn,
    fields: *mut *mut AmlMapper,
) -> c_int {
    guard(|| {
        // SAFETY: (1).
        let o = unsafe { out.as_mut() }.ok_or_else(|| inval("out is NULL"))?;
        if num_fields > 0 && (fields_offset.is_null() || fields.is_null()) {
            return Err(inval("fields without offsets or mappers"));
        }
        /// The `num_fields` entries at `p` (none if there are no fields).
        ///
        /// # Safety
        /// 1. `p` valid for `n` reads when `n` > 0.
        unsafe fn copy<T: Copy>(p: *const T, n: usize) -> Vec<T> {
            if n == 0 {
                return Vec::new();
            }
            // SAFETY: (1).
            unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
        }
        let mut m = Box::new(Owned {
            mapper: AmlMapper::scalar(flags, struct_size),
            // SAFETY: (1): checked non-NULL above when there are fields.
            offsets: unsafe { copy(fields_offset, num_fields) },
            // SAFETY: (1).
            num_elements: (!num_elements.is_null())
                .then(|| unsafe { copy(num_elements, num_fields) }),
            // SAFETY: (1): checked non-NULL above when there are fields.
            fields: unsafe { copy(fields.cast_const(), num_fields) },
        });
        if num_fields > 0 {
            m.mapper.n_fields = num_fields;
            m.mapper.offsets = m.offsets.as_mut_ptr();
            m.mapper.fields = m.fields.as_mut_ptr();
            if let Some(n) = m.num_elements.as_mut().filter(|n| !n.is_empty()) {
                m.mapper.num_elements = n.as_mut_ptr();
            }
        }
        // `mapper` is the first field of a `repr(C)` struct: the box's address is the mapper's.
        *o = Box::into_raw(m).cast();
        Ok(AML_SUCCESS)
    })
}

/// Frees a mapper from `aml_mapper_create` and sets `*mapper` NULL (NULL: no-op).
///
/// # Safety
/// 1. `mapper` NULL or valid; `*mapper` NULL or from `aml_mapper_create`, not in use.
#[no_mangle]
pub unsafe extern "C" fn aml_mapper_destroy(mapper: *mut *mut AmlMapper) {
    // SAFETY: (1).
    if let Some(slot) = unsafe { mapper.as_mut() } {
        if !slot.is_null() {
            // SAFETY: (1): from `Box::into_raw` of an `Owned` (whose first field it is).
            drop(unsafe { Box::from_raw(slot.cast::<Owned>()) });
        }
        *slot = std::ptr::null_mut();
    }
}

/// The mapper of `char`.
#[no_mangle]
pub static aml_char_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_char>());

/// The mapper of `short`.
#[no_mangle]
pub static aml_short_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_short>());

/// The mapper of `int`.
#[no_mangle]
pub static aml_int_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_int>());

/// The mapper of `long`.
#[no_mangle]
pub static aml_long_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_long>());

/// The mapper of `long long`.
#[no_mangle]
pub static aml_long_long_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_longlong>());

/// The mapper of `unsigned char`.
#[no_mangle]
pub static aml_uchar_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_uchar>());

/// The mapper of `unsigned int`.
#[no_mangle]
pub static aml_uint_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_uint>());

/// The mapper of `unsigned long`.
#[no_mangle]
pub static aml_ulong_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_ulong>());

/// The mapper of `unsigned long long`.
#[no_mangle]
pub static aml_ulong_long_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_ulonglong>());

/// The mapper of `float`.
#[no_mangle]
pub static aml_float_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_float>());

/// The mapper of `double`.
#[no_mangle]
pub static aml_double_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<c_double>());

/// The mapper of `long double`.
#[no_mangle]
pub static aml_long_double_mapper: AmlMapper = AmlMapper::scalar(0, LONG_DOUBLE);

/// The mapper of `void *`.
#[no_mangle]
pub static aml_ptr_mapper: AmlMapper = AmlMapper::scalar(0, size_of::<*mut c_void>());

/// The mapper of `char`, allocated apart from its parent.
#[no_mangle]
pub static aml_char_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_char>());

/// The mapper of `short`, allocated apart from its parent.
#[no_mangle]
pub static aml_short_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_short>());

/// The mapper of `int`, allocated apart from its parent.
#[no_mangle]
pub static aml_int_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_int>());

/// The mapper of `long`, allocated apart from its parent.
#[no_mangle]
pub static aml_long_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_long>());

/// The mapper of `long long`, allocated apart from its parent.
#[no_mangle]
pub static aml_long_long_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_longlong>());

/// The mapper of `unsigned char`, allocated apart from its parent.
#[no_mangle]
pub static aml_uchar_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_uchar>());

/// The mapper of `unsigned short`, allocated apart from its parent.
#[no_mangle]
pub static aml_ushort_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_ushort>());

/// The mapper of `unsigned int`, allocated apart from its parent.
#[no_mangle]
pub static aml_uint_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_uint>());

/// The mapper of `unsigned long`, allocated apart from its parent.
#[no_mangle]
pub static aml_ulong_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_ulong>());

/// The mapper of `unsigned long long`, allocated apart from its parent.
#[no_mangle]
pub static aml_ulong_long_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_ulonglong>());

/// The mapper of `float`, allocated apart from its parent.
#[no_mangle]
pub static aml_float_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_float>());

/// The mapper of `double`, allocated apart from its parent.
#[no_mangle]
pub static aml_double_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<c_double>());

/// The mapper of `long double`, allocated apart from its parent.
#[no_mangle]
pub static aml_long_double_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, LONG_DOUBLE);

/// The mapper of `void *`, allocated apart from its parent.
#[no_mangle]
pub static aml_ptr_split_mapper: AmlMapper =
    AmlMapper::scalar(AML_MAPPER_FLAG_SPLIT, size_of::<*mut c_void>());
