"""What users run around the library, not the library: the `netreduce` command (`cli`), the
lab launcher (`launch`), the main job (`demo`), the benchmark (`bench`) and the deterministic
inputs they check results with (`reference`). The library (`netreduce.api`, `comm`,
`algorithms`, `registration`, `torch`) never imports this package.
"""
