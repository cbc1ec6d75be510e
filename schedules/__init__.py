"""TensorIR schedule rules of plus_tvm (one rule per file, per target family).

Phase 4 of the pipeline (``plus_tvm.pipeline.schedule_phase``) tries the rules of this package
before TVM's own dlight rules; the GIR rules of the PowerFusion work land here.
"""
