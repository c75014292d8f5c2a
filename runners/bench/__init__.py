"""Benchmarks behind ``mixlab bench``: the kernels (``shortconv``, ``rubiconv``, ``attention``, fla-core's ops in
``fla``) beside public ones (``anchors``), training throughput (``train``) and the MAD protocol's cost (``mad``);
``utils`` holds the timing and error measures they share."""
