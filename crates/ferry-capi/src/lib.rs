//! C ABI for ferry, shaped like AML's DMA interface. Placeholder until the C API lands.
