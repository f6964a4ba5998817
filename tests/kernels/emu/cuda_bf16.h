// Empty: the emulated kernels use no half types.
