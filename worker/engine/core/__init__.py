"""The engine's bottom layer: what every other part of it imports, and which imports none of
them. The errors and interrupts, the device, the registry every named entry is kept in, what
the caller gives a job (resources.py), the banks of fixed tensors and the reference cache
(with its IRI kind), the work units and their tracker, the sizes work is counted from, a job's
context and its steps, and the method version. The layers above, bottom to top: data,
measures, models, iri, stitching, protocols, job (docs/architecture.md)."""
