"""hotcold: a benchmark harness for DLRM training with embedding tables larger than accelerator memory."""
__version__ = "0.1.0"
