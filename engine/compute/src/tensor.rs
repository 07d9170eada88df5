//! Tensors on a backend (activations) and weights (views of device memory the memory manager owns).
//!
//! A [`Tensor`] is dense and row-major; its buffer belongs to the backend and is shared (`Clone` is cheap), so
//! a reshape never copies. A [`Weight`] is a view of weight bytes in device memory (a VBAR page, a scratch
//! slice or a plain allocation) in its *stored* element type; ops widen or cast it as they read. A weight view
//! borrows the guard that keeps its bytes in place (see `memory::weights`), so it cannot outlive them.

use std::marker::PhantomData;

use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::DevPtr;
use crate::quant::Quant;

/// Number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A dense row-major tensor held by backend `B`.
pub struct Tensor<B: Backend> {
    buf: B::Buf,
    shape: Vec<usize>,
    dtype: DType,
}

impl<B: Backend> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Tensor { buf: self.buf.clone(), shape: self.shape.clone(), dtype: self.dtype }
    }
}

impl<B: Backend> std::fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}>{:?}", self.dtype, self.shape)
    }
}

impl<B: Backend> Tensor<B> {
    /// Wraps a backend buffer. Backends call this; `buf` must hold `numel(shape)` elements of `dtype`.
    pub fn from_parts(buf: B::Buf, shape: Vec<usize>, dtype: DType) -> Tensor<B> {
        Tensor { buf, shape, dtype }
    }

    /// The backend buffer.
    pub fn buf(&self) -> &B::Buf {
        &self.buf
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Size of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: isize) -> Result<usize> {
        let d = resolve_dim(dim, self.shape.len())?;
        Ok(self.shape[d])
    }

    /// The same elements under another shape (no copy). One dimension may be `usize::MAX`, meaning "the rest".
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<B>> {
        let n = self.numel();
        let known: usize = shape.iter().filter(|&&d| d != usize::MAX).product();
        let holes = shape.iter().filter(|&&d| d == usize::MAX).count();
        let shape: Vec<usize> = match holes {
            0 => shape.to_vec(),
            1 if known > 0 && n.is_multiple_of(known) => {
                shape.iter().map(|&d| if d == usize::MAX { n / known } else { d }).collect()
            }
            _ => {
                return Err(Error::shape(
                    "reshape",
                    format!("cannot view {:?} as {shape:?}", self.shape),
                ));
            }
        };
        if numel(&shape) != n {
            return Err(Error::shape(
                "reshape",
                format!("cannot view {:?} as {shape:?}", self.shape),
            ));
        }
        Ok(Tensor { buf: self.buf.clone(), shape, dtype: self.dtype })
    }
}

/// Turns a possibly negative dimension index into a position in a shape of rank `rank`.
pub fn resolve_dim(dim: isize, rank: usize) -> Result<usize> {
    let d = if dim < 0 { rank as isize + dim } else { dim };
    if d < 0 || d as usize >= rank {
        return Err(Error::shape("dim", format!("dimension {dim} of a rank-{rank} tensor")));
    }
    Ok(d as usize)
}

/// A view of a weight's bytes in device memory, in its stored element type.
///
/// The lifetime ties the view to whatever keeps the bytes in place (a layer guard of the memory manager, or an
/// [`OwnedWeight`]). A quantized weight ([`Quant`]) also says where its scale table lies (right after its
/// values in the same slot) and which row of the table its first row is (after [`Weight::rows`]).
#[derive(Debug, Clone)]
pub struct Weight<'a> {
    ptr: DevPtr,
    dtype: DType,
    shape: Vec<usize>,
    quant: Quant,
    /// The scale table of a row or block format ([`Quant::has_table`]).
    table: DevPtr,
    /// The table row of this view's first row.
    row0: usize,
    _bytes: PhantomData<&'a ()>,
}

impl<'a> Weight<'a> {
    /// A view of `numel(shape)` elements of `dtype` at `ptr`.
    ///
    /// Callers (the memory manager and [`OwnedWeight`]) promise that the bytes stay mapped and unchanged for
    /// `'a`.
    pub(crate) fn new(ptr: DevPtr, dtype: DType, shape: Vec<usize>) -> Weight<'a> {
        Weight {
            ptr,
            dtype,
            shape,
            quant: Quant::None,
            table: DevPtr(0),
            row0: 0,
            _bytes: PhantomData,
        }
    }

    /// The same bytes standing for their stored values times `scale` (a per-tensor quantization scale, as
    /// ComfyUI's scaled fp8 files keep beside a weight): ops read `widen(q) · scale`.
    pub fn with_scale(mut self, scale: Option<f32>) -> Weight<'a> {
        self.quant = scale.map_or(Quant::None, Quant::Tensor);
        self
    }

    /// The same bytes in the quantized format `quant`, with its scale table (if the format has one) at
    /// `table`. The caller promises the table stays in place as long as the values ([`Weight::new`]).
    pub(crate) fn with_quant(mut self, quant: Quant, table: DevPtr) -> Weight<'a> {
        self.quant = quant;
        self.table = table;
        self
    }

    /// The per-tensor scale the stored values are multiplied by, if any.
    pub fn scale(&self) -> Option<f32> {
        match self.quant {
            Quant::Tensor(scale) => Some(scale),
            _ => None,
        }
    }

    /// The quantized format of the stored values.
    pub fn quant(&self) -> Quant {
        self.quant
    }

    /// The device address of the scale table (meaningful when [`Quant::has_table`]).
    pub fn table(&self) -> DevPtr {
        self.table
    }

    /// The table row of this view's first row.
    pub fn row0(&self) -> usize {
        self.row0
    }

    /// `[rows, values per row]` of a 2-D weight: its shape, except that an NVFP4 weight's rows hold two values
    /// per stored byte.
    pub fn matrix(&self, op: &'static str) -> Result<(usize, usize)> {
        match self.shape[..] {
            [rows, cols] => Ok((rows, self.quant.row_values(cols))),
            _ => Err(Error::shape(op, format!("weight must be [out, in], got {:?}", self.shape))),
        }
    }

    /// An error unless the weight is stored as plain values: for the ops that read weights as they are stored
    /// (norms, convolutions), which ComfyUI never gives a quantized weight.
    pub fn require_unscaled(&self, op: &'static str) -> Result<()> {
        match self.quant {
            Quant::None => Ok(()),
            q => Err(Error::Unsupported(format!(
                "{op} on a quantized ({}) weight {:?}",
                q.name(),
                self.shape
            ))),
        }
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// Stored element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Number of values (two per stored byte for NVFP4, else the elements).
    pub fn values(&self) -> usize {
        self.quant.row_values(self.numel())
    }

    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }

    /// The same bytes under another shape with as many elements. A weight with a row or block table keeps its
    /// rows: only views that leave the first dimension alone are allowed.
    pub fn reshape(&self, shape: &[usize]) -> Result<Weight<'a>> {
        if numel(shape) != self.numel()
            || (self.quant.has_table() && shape.first() != self.shape.first())
        {
            return Err(Error::shape(
                "reshape",
                format!("cannot view weight {:?} as {shape:?}", self.shape),
            ));
        }
        Ok(Weight { shape: shape.to_vec(), ..self.clone() })
    }

    /// Rows `start..start + len` of dimension 0 (a fused qkv weight split into q, k and v, for example).
    pub fn rows(&self, start: usize, len: usize) -> Result<Weight<'a>> {
        let rows = *self
            .shape
            .first()
            .ok_or_else(|| Error::shape("rows", "a rank-0 weight has no rows"))?;
        if start + len > rows {
            return Err(Error::shape("rows", format!("rows {start}..{} of {rows}", start + len)));
        }
        let row_bytes = (self.numel() / rows.max(1) * self.dtype.size()) as u64;
        let mut shape = self.shape.clone();
        shape[0] = len;
        let table = match self.quant {
            // Per-row int8 scales move with their rows; the block tables are addressed by `row0`.
            Quant::Int8 { per_row: true, .. } => self.table.offset(4 * start as u64),
            _ => self.table,
        };
        Ok(Weight {
            ptr: self.ptr.offset(start as u64 * row_bytes),
            shape,
            table,
            row0: self.row0 + start,
            ..self.clone()
        })
    }
}

/// A weight in a plain device allocation of its own, freed on drop: tiny weights the memory manager
/// force-casts (§5.1 of the memory-manager brief), and weights built by tests.
pub struct OwnedWeight {
    ptr: DevPtr,
    dtype: DType,
    shape: Vec<usize>,
    allocator: Allocator,
}

/// Where an [`OwnedWeight`]'s memory came from, and goes back to.
enum Allocator {
    /// Straight from the device.
    Device(std::sync::Arc<dyn crate::memory::DeviceMemory>),
    /// Through an allocator that accounts for it (the memory manager's VRAM arbiter).
    Counted(std::sync::Arc<dyn crate::memory::device::DeviceAllocator>),
}

impl Allocator {
    fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        match self {
            Allocator::Device(memory) => memory.alloc(bytes),
            Allocator::Counted(allocator) => allocator.alloc(bytes),
        }
    }

    fn free(&self, ptr: DevPtr) -> Result<()> {
        match self {
            Allocator::Device(memory) => memory.free(ptr),
            Allocator::Counted(allocator) => allocator.free(ptr),
        }
    }
}

impl OwnedWeight {
    /// Uploads `bytes` (`numel(shape)` little-endian elements of `dtype`) into a new allocation on `memory`.
    pub fn upload(
        memory: &std::sync::Arc<dyn crate::memory::DeviceMemory>,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<OwnedWeight> {
        OwnedWeight::upload_into(
            Allocator::Device(memory.clone()),
            memory.as_ref(),
            (dtype, shape, 0),
            bytes,
        )
    }

    /// [`OwnedWeight::upload`] with the memory taken from `allocator` (which must allocate on `memory`), so it
    /// is counted where `allocator` counts: the memory manager's force-cast weights come from its arbiter.
    /// `table` bytes of a quantized weight's scale table follow the values in `bytes`.
    pub(crate) fn upload_counted(
        allocator: std::sync::Arc<dyn crate::memory::device::DeviceAllocator>,
        memory: &dyn crate::memory::DeviceMemory,
        (dtype, shape, table): (DType, &[usize], usize),
        bytes: &[u8],
    ) -> Result<OwnedWeight> {
        OwnedWeight::upload_into(
            Allocator::Counted(allocator),
            memory,
            (dtype, shape, table),
            bytes,
        )
    }

    fn upload_into(
        allocator: Allocator,
        memory: &dyn crate::memory::DeviceMemory,
        (dtype, shape, table): (DType, &[usize], usize),
        bytes: &[u8],
    ) -> Result<OwnedWeight> {
        let len = numel(shape) * dtype.size() + table;
        if bytes.len() != len {
            return Err(Error::shape(
                "upload",
                format!("{shape:?} of {dtype} needs {len} bytes, got {}", bytes.len()),
            ));
        }
        // At least one byte is allocated: an empty tensor still has an address.
        let ptr = allocator.alloc(len.max(1) as u64)?;
        let weight = OwnedWeight { ptr, dtype, shape: shape.to_vec(), allocator };
        memory.copy_h2d_pageable(ptr, bytes)?;
        Ok(weight)
    }

    /// Uploads f32 values stored as `dtype` (rounded to nearest even).
    pub fn from_f32(
        memory: &std::sync::Arc<dyn crate::memory::DeviceMemory>,
        dtype: DType,
        shape: &[usize],
        values: &[f32],
    ) -> Result<OwnedWeight> {
        OwnedWeight::upload(memory, dtype, shape, &crate::dtype::narrow(dtype, values))
    }

    /// `x`'s values stored as a new weight of `dtype` on the backend's device, without leaving it (a weight
    /// derived from another: one temporal tap of a 3-D convolution kernel), taken through the backend's
    /// [`crate::Backend::device_allocator`] where it has one (the memory manager's arbiter, which counts it).
    pub fn from_tensor<B: crate::Backend>(
        b: &B,
        x: &Tensor<B>,
        dtype: DType,
    ) -> Result<OwnedWeight> {
        let weight = OwnedWeight::allocate(b, x.shape(), dtype)?;
        b.store(x, weight.ptr, dtype, None)?;
        Ok(weight)
    }

    /// A new weight of `shape` and `dtype` on the backend's device, its bytes not yet written, taken as
    /// [`OwnedWeight::from_tensor`] takes its memory.
    pub(crate) fn allocate<B: crate::Backend>(
        b: &B,
        shape: &[usize],
        dtype: DType,
    ) -> Result<OwnedWeight> {
        let allocator = match b.device_allocator() {
            Some(counted) => Allocator::Counted(counted),
            None => Allocator::Device(b.memory().clone()),
        };
        let len = numel(shape) * dtype.size();
        // At least one byte is allocated: an empty tensor still has an address.
        let ptr = allocator.alloc(len.max(1) as u64)?;
        Ok(OwnedWeight { ptr, dtype, shape: shape.to_vec(), allocator })
    }

    /// The view compute ops take.
    pub fn view(&self) -> Weight<'_> {
        Weight::new(self.ptr, self.dtype, self.shape.clone())
    }
}

impl Drop for OwnedWeight {
    fn drop(&mut self) {
        if let Err(e) = self.allocator.free(self.ptr) {
            tracing::warn!(error = %e, "freeing a weight allocation failed");
        }
    }
}
