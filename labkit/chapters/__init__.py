"""Each chapter's instruments, named by topic; ``course`` is the glue every chapter notebook shares
(``lk.course``)."""
