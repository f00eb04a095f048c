"""Lightning glue: modules, callbacks, loggers. The maths lives in geocont.metrics."""
