"""Benchmarks behind ``mixlab bench``: the kernels (``shortconv``, ``rubiconv``, ``attention``, fla-core's ops in
``fla``) beside public ones (``anchors``), their launch settings (``tune``), training throughput (``train``), the
MAD protocol's cost (``mad``), and where the time goes (``profile``, ``profile_host``: ``mixlab bench profile``);
``utils`` holds the timing and error measures they share."""
