"""numpy references: the ground truth each kernel in cuda/<k>.cu is tested against."""
