//! Operation graphs of cuDNN's backend API: descriptors (destroyed on drop) and a builder of tensors and
//! matmul, pointwise and reduction operations, with the heuristic's engine configurations for a finalized graph.
//! `attention.rs` builds its graph with it.

use std::ffi::c_void;

use cudarc::cudnn::sys;

use super::Handle;
use crate::error::{Error, Result};

pub(super) use sys::cudnnBackendAttributeName_t as Name;
pub(super) use sys::cudnnBackendAttributeType_t as Kind;
pub(super) use sys::cudnnBackendDescriptorType_t as Desc;
pub(super) use sys::cudnnDataType_t as Data;
pub(super) use sys::cudnnPointwiseMode_t as Pointwise;

/// A cuDNN call's status as a result; an error carries cuDNN's own last message.
pub(super) fn check(call: &'static str, status: sys::cudnnStatus_t) -> Result<()> {
    status.result().map_err(|e| {
        let mut message = [0u8; 512];
        // SAFETY: the buffer holds `message.len()` bytes, within which cuDNN writes its message.
        unsafe { sys::cudnnGetLastErrorString(message.as_mut_ptr().cast(), message.len()) };
        let text = std::ffi::CStr::from_bytes_until_nul(&message).map_or_else(
            |_| String::from_utf8_lossy(&message).into_owned(),
            |c| c.to_string_lossy().into_owned(),
        );
        Error::driver(call, format!("{e:?} {}", text.trim()))
    })
}

/// One backend descriptor, destroyed on drop.
pub(super) struct Descriptor(pub(super) sys::cudnnBackendDescriptor_t);

// SAFETY: a finalized descriptor is plain host state of cuDNN's, not tied to a thread; every use of a plan goes
// through the plans' mutex (and the handle's).
unsafe impl Send for Descriptor {}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnBackendCreateDescriptor`, destroyed once, here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Descriptor {
    /// A new descriptor of `kind`, its attributes unset.
    pub(super) fn new(kind: Desc) -> Result<Descriptor> {
        let mut d: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` is written with the new descriptor.
        check("cudnnBackendCreateDescriptor", unsafe {
            sys::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Descriptor(d))
    }

    /// Sets attribute `name` to `values`, each of the C type `kind` names (the caller pairs them).
    pub(super) fn set<T: Copy>(&self, name: Name, kind: Kind, values: &[T]) -> Result<()> {
        // SAFETY: the descriptor is alive and `values` holds `values.len()` elements of the type `kind` names;
        // cuDNN copies them before returning.
        check("cudnnBackendSetAttribute", unsafe {
            sys::cudnnBackendSetAttribute(
                self.0,
                name,
                kind,
                values.len() as i64,
                values.as_ptr().cast::<c_void>(),
            )
        })
    }

    /// Sets an int64 attribute (dimensions, strides, a unique id, an alignment, an axis).
    pub(super) fn set_i64s(&self, name: Name, values: &[i64]) -> Result<()> {
        self.set(name, Kind::CUDNN_TYPE_INT64, values)
    }

    /// Sets a data-type attribute.
    pub(super) fn set_data(&self, name: Name, data: Data) -> Result<()> {
        self.set(name, Kind::CUDNN_TYPE_DATA_TYPE, &[data])
    }

    /// Sets a boolean attribute to true (a C `bool`, one byte).
    pub(super) fn set_true(&self, name: Name) -> Result<()> {
        self.set(name, Kind::CUDNN_TYPE_BOOLEAN, &[true])
    }

    /// Sets an attribute to descriptors (an operation's tensors, a graph's operations).
    pub(super) fn set_descriptors(
        &self,
        name: Name,
        values: &[sys::cudnnBackendDescriptor_t],
    ) -> Result<()> {
        self.set(name, Kind::CUDNN_TYPE_BACKEND_DESCRIPTOR, values)
    }

    /// Sets a handle attribute to `handle`.
    pub(super) fn set_handle(&self, name: Name, handle: &Handle) -> Result<()> {
        self.set(name, Kind::CUDNN_TYPE_HANDLE, &[handle.0])
    }

    /// Finalizes the descriptor: where cuDNN checks its attributes (and, for a plan, compiles its kernel).
    pub(super) fn finalize(&self) -> Result<()> {
        // SAFETY: the descriptor is alive.
        check("cudnnBackendFinalize", unsafe { sys::cudnnBackendFinalize(self.0) })
    }
}

/// Whether a graph tensor is passed at each call, passed by value (a host scalar) or never written (virtual).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Passed,
    ByValue,
    Virtual,
}

/// An operation graph being built: every descriptor it made (kept alive for the plan) and its operations in order.
pub(super) struct Graph {
    pub(super) keep: Vec<Descriptor>,
    pub(super) ops: Vec<sys::cudnnBackendDescriptor_t>,
    next_virtual: i64,
}

/// A descriptor's raw handle, owned by a [`Descriptor`] elsewhere.
pub(super) type Raw = sys::cudnnBackendDescriptor_t;

impl Graph {
    /// An empty graph whose virtual tensors are numbered from `first_virtual` + 1.
    pub(super) fn new(first_virtual: i64) -> Graph {
        Graph { keep: Vec::new(), ops: Vec::new(), next_virtual: first_virtual }
    }

    /// Keeps `d` alive as long as the graph, returning its raw handle.
    pub(super) fn keep(&mut self, d: Descriptor) -> Raw {
        let raw = d.0;
        self.keep.push(d);
        raw
    }

    /// A rank-4 tensor; `uid` for a passed or by-value one, virtual ones numbered here.
    pub(super) fn tensor(
        &mut self,
        data: Data,
        dims: [usize; 4],
        strides: [usize; 4],
        role: Role,
        uid: i64,
    ) -> Result<Raw> {
        let t = Descriptor::new(Desc::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        t.set_data(Name::CUDNN_ATTR_TENSOR_DATA_TYPE, data)?;
        t.set_i64s(Name::CUDNN_ATTR_TENSOR_DIMENSIONS, &dims.map(|v| v as i64))?;
        t.set_i64s(Name::CUDNN_ATTR_TENSOR_STRIDES, &strides.map(|v| v as i64))?;
        let uid = if role == Role::Virtual {
            self.next_virtual += 1;
            self.next_virtual
        } else {
            uid
        };
        t.set_i64s(Name::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?;
        t.set_i64s(Name::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
        match role {
            Role::Virtual => t.set_true(Name::CUDNN_ATTR_TENSOR_IS_VIRTUAL)?,
            Role::ByValue => t.set_true(Name::CUDNN_ATTR_TENSOR_IS_BY_VALUE)?,
            Role::Passed => {}
        }
        t.finalize()?;
        Ok(self.keep(t))
    }

    /// A virtual f32 tensor of `dims` (contiguous).
    pub(super) fn virtual_f32(&mut self, dims: [usize; 4]) -> Result<Raw> {
        self.tensor(Data::CUDNN_DATA_FLOAT, dims, contiguous(dims), Role::Virtual, 0)
    }

    fn op(&mut self, op: Descriptor) -> Result<()> {
        op.finalize()?;
        let raw = self.keep(op);
        self.ops.push(raw);
        Ok(())
    }

    /// `c = a·b` over the last two dimensions, batched over the first two, accumulated in f32.
    pub(super) fn matmul(&mut self, a: Raw, b: Raw, c: Raw) -> Result<()> {
        let m = Descriptor::new(Desc::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        m.set_data(Name::CUDNN_ATTR_MATMUL_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        m.finalize()?;
        let m = self.keep(m);
        let op = Descriptor::new(Desc::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[a])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[b])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[c])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[m])?;
        self.op(op)
    }

    /// `y = mode(x[, b][, t])` elementwise (broadcasting), computed in `precision`; `axis` for an index generator.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pointwise(
        &mut self,
        mode: Pointwise,
        precision: Data,
        axis: Option<i64>,
        x: Raw,
        b: Option<Raw>,
        t: Option<Raw>,
        y: Raw,
    ) -> Result<()> {
        let p = Descriptor::new(Desc::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        p.set(Name::CUDNN_ATTR_POINTWISE_MODE, Kind::CUDNN_TYPE_POINTWISE_MODE, &[mode])?;
        p.set_data(Name::CUDNN_ATTR_POINTWISE_MATH_PREC, precision)?;
        if let Some(axis) = axis {
            p.set_i64s(Name::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        p.finalize()?;
        let p = self.keep(p);
        let op = Descriptor::new(Desc::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[p])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
        if let Some(b) = b {
            op.set_descriptors(Name::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
        }
        if let Some(t) = t {
            op.set_descriptors(Name::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, &[t])?;
        }
        op.set(Name::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, Kind::CUDNN_TYPE_FLOAT, &[1.0f32])?;
        op.set(Name::CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, Kind::CUDNN_TYPE_FLOAT, &[1.0f32])?;
        self.op(op)
    }

    /// An f32 `y = mode(x)` elementwise.
    pub(super) fn unary(&mut self, mode: Pointwise, x: Raw, y: Raw) -> Result<()> {
        self.pointwise(mode, Data::CUDNN_DATA_FLOAT, None, x, None, None, y)
    }

    /// An f32 `y = mode(x, b)` elementwise.
    pub(super) fn binary(&mut self, mode: Pointwise, x: Raw, b: Raw, y: Raw) -> Result<()> {
        self.pointwise(mode, Data::CUDNN_DATA_FLOAT, None, x, Some(b), None, y)
    }

    /// `y = reduce(x)` over the last dimension (`y`'s is 1), in f32.
    pub(super) fn reduction(
        &mut self,
        operator: sys::cudnnReduceTensorOp_t,
        x: Raw,
        y: Raw,
    ) -> Result<()> {
        let r = Descriptor::new(Desc::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
        r.set_data(Name::CUDNN_ATTR_REDUCTION_COMP_TYPE, Data::CUDNN_DATA_FLOAT)?;
        r.set(
            Name::CUDNN_ATTR_REDUCTION_OPERATOR,
            Kind::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
            &[operator],
        )?;
        r.finalize()?;
        let r = self.keep(r);
        let op = Descriptor::new(Desc::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[r])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[x])?;
        op.set_descriptors(Name::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[y])?;
        self.op(op)
    }

    /// The operation graph of the operations made so far, finalized and kept: on `handle`'s device where given,
    /// else (cuDNN 9.8 and later) without one, for a device described to the heuristic.
    pub(super) fn operation_graph(&mut self, handle: Option<&Handle>) -> Result<Raw> {
        let graph = Descriptor::new(Desc::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set_descriptors(Name::CUDNN_ATTR_OPERATIONGRAPH_OPS, &self.ops)?;
        if let Some(handle) = handle {
            graph.set_handle(Name::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
        }
        graph.finalize()?;
        Ok(self.keep(graph))
    }

    /// The engine configurations cuDNN's heuristic (mode A) offers for the finalized operation graph `graph`, best
    /// first, kept in the graph; for the device `device` describes where given, else the handle's.
    pub(super) fn configs(&mut self, graph: Raw, device: Option<&Descriptor>) -> Result<Vec<Raw>> {
        let heuristic = Descriptor::new(Desc::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heuristic.set_descriptors(Name::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
        let mode = sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A;
        heuristic.set(Name::CUDNN_ATTR_ENGINEHEUR_MODE, Kind::CUDNN_TYPE_HEUR_MODE, &[mode])?;
        if let Some(device) = device {
            heuristic.set_descriptors(Name::CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, &[device.0])?;
        }
        heuristic.finalize()?;
        let mut count = 0i64;
        // SAFETY: asking for 0 elements only writes the count.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                heuristic.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Kind::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut count,
                std::ptr::null_mut(),
            )
        })?;
        let configs = (0..count.clamp(0, 64))
            .map(|_| Descriptor::new(Desc::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<Raw> = configs.iter().map(|c| c.0).collect();
        let mut returned = 0i64;
        // SAFETY: `raw` holds `raw.len()` created, unfinalized engine-config descriptors for cuDNN to fill;
        // `returned` is written.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                heuristic.0,
                Name::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Kind::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len() as i64,
                &mut returned,
                raw.as_mut_ptr().cast::<c_void>(),
            )
        })?;
        self.keep(heuristic);
        raw.truncate(returned.clamp(0, raw.len() as i64) as usize);
        self.keep.extend(configs);
        Ok(raw)
    }
}

/// Row-major strides of `dims`.
pub(super) fn contiguous(dims: [usize; 4]) -> [usize; 4] {
    [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
}
