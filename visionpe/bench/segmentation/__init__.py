"""The segmentation benchmark (visionpe-bench segment): a linear head on the backbone's patch tokens, mIoU beyond the
training canvas, each PE against NoPE."""
