"""What analysis reads: a sweep's runs as arrays (``sweep``), loaded from the registry's reader and
cached (``loading``), selected and named (``select``); the one error of a bad question (``errors``)."""
