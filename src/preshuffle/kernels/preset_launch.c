/* A kernel launch whose parameters are laid out once (preshuffle.kernels.preset_launch).
 *
 * make() copies every parameter into storage of its own and keeps the launch configuration; launch() writes the
 * call's addresses into their slots and calls cuLaunchKernelEx on the stream it is given. Triton's C launcher
 * parses every argument of the kernel on every call; here a call passes six integers. The GIL is held
 * throughout, so two threads cannot interleave their writes into the same storage. libcuda is opened on the
 * first launch, so the module builds and loads on machines without a GPU. */
#include "cuda.h"
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SLOT_BYTES 128 /* the largest parameter, a CUtensorMap; every slot is 128-byte aligned */
#define MAX_ADDRESSES 8

/* The object Triton's fill_tma_descriptor returns (triton/backends/nvidia/driver.c), read as its launcher reads it. */
typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} TritonTensorMap;

typedef struct {
  CUfunction function;
  CUlaunchConfig config;
  int device;
  int n_addresses;
  unsigned long long *addresses[MAX_ADDRESSES];
  void **params;
  char *storage;
} Preset;

typedef CUresult (*launch_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*error_fn)(CUresult, const char **);
static launch_fn launch_kernel;
static ctx_get_fn ctx_get;
static device_get_fn device_get;
static retain_fn primary_retain;
static ctx_set_fn ctx_set;
static error_fn error_string;

static int open_driver(void) {
  if (launch_kernel) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    PyErr_SetString(PyExc_RuntimeError, "preset launch: cannot open libcuda.so.1 (no NVIDIA driver here)");
    return -1;
  }
  ctx_get = (ctx_get_fn)dlsym(lib, "cuCtxGetCurrent");
  device_get = (device_get_fn)dlsym(lib, "cuDeviceGet");
  primary_retain = (retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
  ctx_set = (ctx_set_fn)dlsym(lib, "cuCtxSetCurrent");
  error_string = (error_fn)dlsym(lib, "cuGetErrorString");
  launch_fn launch = (launch_fn)dlsym(lib, "cuLaunchKernelEx");
  if (!ctx_get || !device_get || !primary_retain || !ctx_set || !error_string || !launch) {
    PyErr_SetString(PyExc_RuntimeError, "preset launch: libcuda.so.1 lacks cuLaunchKernelEx (needs CUDA 12+)");
    return -1;
  }
  launch_kernel = launch;
  return 0;
}

static int check(CUresult result, const char *what) {
  if (result == CUDA_SUCCESS) return 0;
  const char *message = NULL;
  error_string(result, &message);
  PyErr_Format(PyExc_RuntimeError, "preset launch: %s failed: %s", what, message ? message : "unknown error");
  return -1;
}

static void preset_free(PyObject *capsule) {
  Preset *p = (Preset *)PyCapsule_GetPointer(capsule, "preshuffle.preset");
  if (!p) return;
  free(p->storage);
  free(p->params);
  free(p);
}

/* make(function, grid_x, grid_y, block_x, shared_bytes, device, params, address_slots): params, a tuple of bytes
 * (at most 128 each) or Triton tensor maps, in the kernel's order; address_slots, the indices of the 8-byte
 * parameters that launch() fills. */
static PyObject *make(PyObject *self, PyObject *args) {
  unsigned long long function;
  unsigned int grid_x, grid_y, block_x, shared;
  int device;
  PyObject *params, *slots;
  if (!PyArg_ParseTuple(args, "KIIIIiO!O!", &function, &grid_x, &grid_y, &block_x, &shared, &device, &PyTuple_Type,
                        &params, &PyTuple_Type, &slots))
    return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(params), n_slots = PyTuple_GET_SIZE(slots);
  if (n_slots > MAX_ADDRESSES) {
    PyErr_Format(PyExc_ValueError, "address_slots: at most %d, got %zd", MAX_ADDRESSES, n_slots);
    return NULL;
  }
  Preset *p = (Preset *)calloc(1, sizeof(Preset));
  if (!p) return PyErr_NoMemory();
  p->params = (void **)calloc(n ? n : 1, sizeof(void *));
  p->storage = (char *)aligned_alloc(SLOT_BYTES, (n ? n : 1) * SLOT_BYTES);
  if (!p->params || !p->storage) {
    free(p->params);
    free(p->storage);
    free(p);
    return PyErr_NoMemory();
  }
  memset(p->storage, 0, (n ? n : 1) * SLOT_BYTES);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *item = PyTuple_GET_ITEM(params, i);
    char *slot = p->storage + i * SLOT_BYTES;
    p->params[i] = slot;
    if (PyBytes_Check(item)) {
      Py_ssize_t size = PyBytes_GET_SIZE(item);
      if (size == 0 || size > SLOT_BYTES) {
        PyErr_Format(PyExc_ValueError, "params[%zd]: 1 to %d bytes, got %zd", i, SLOT_BYTES, size);
        goto fail;
      }
      memcpy(slot, PyBytes_AS_STRING(item), size);
    } else if (strcmp(Py_TYPE(item)->tp_name, "triton.backends.nvidia.PyCUtensorMap") == 0 &&
               Py_TYPE(item)->tp_basicsize == sizeof(TritonTensorMap)) {
      memcpy(slot, &((TritonTensorMap *)item)->tensorMap, sizeof(CUtensorMap));
    } else {
      PyErr_Format(PyExc_TypeError, "params[%zd]: bytes or a Triton tensor map of this Triton's layout, got %s", i,
                   Py_TYPE(item)->tp_name);
      goto fail;
    }
  }
  for (Py_ssize_t k = 0; k < n_slots; ++k) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, k));
    if (i < 0 || i >= n) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "address_slots[%zd]: an index of params, got %zd", k, i);
      goto fail;
    }
    p->addresses[k] = (unsigned long long *)(p->storage + i * SLOT_BYTES);
  }
  p->n_addresses = (int)n_slots;
  p->function = (CUfunction)(uintptr_t)function;
  p->device = device;
  p->config.gridDimX = grid_x;
  p->config.gridDimY = grid_y;
  p->config.gridDimZ = 1;
  p->config.blockDimX = block_x;
  p->config.blockDimY = 1;
  p->config.blockDimZ = 1;
  p->config.sharedMemBytes = shared;
  p->config.attrs = NULL;
  p->config.numAttrs = 0;
  PyObject *capsule = PyCapsule_New(p, "preshuffle.preset", preset_free);
  if (capsule) return capsule;
fail:
  free(p->storage);
  free(p->params);
  free(p);
  return NULL;
}

/* launch(preset, stream, *addresses) */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "launch(preset, stream, *addresses)");
    return NULL;
  }
  Preset *p = (Preset *)PyCapsule_GetPointer(args[0], "preshuffle.preset");
  if (!p) return NULL;
  if (nargs - 2 != p->n_addresses) {
    PyErr_Format(PyExc_TypeError, "launch: %d addresses, got %zd", p->n_addresses, nargs - 2);
    return NULL;
  }
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
  for (int k = 0; k < p->n_addresses; ++k) *p->addresses[k] = PyLong_AsUnsignedLongLong(args[2 + k]);
  if (PyErr_Occurred()) return NULL;
  if (open_driver()) return NULL;
  CUcontext context = NULL;
  if (check(ctx_get(&context), "cuCtxGetCurrent")) return NULL;
  if (!context) { /* a thread that has not used CUDA yet: the device's primary context, as PyTorch uses */
    CUdevice dev;
    if (check(device_get(&dev, p->device), "cuDeviceGet") ||
        check(primary_retain(&context, dev), "cuDevicePrimaryCtxRetain") || check(ctx_set(context), "cuCtxSetCurrent"))
      return NULL;
  }
  p->config.hStream = (CUstream)(uintptr_t)stream;
  if (check(launch_kernel(&p->config, p->function, p->params, NULL), "cuLaunchKernelEx")) return NULL;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "A preset launch (a capsule) from the kernel's parameters."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "Launch a preset with the call's addresses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "preshuffle_preset_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_preshuffle_preset_launch(void) { return PyModule_Create(&module); }
