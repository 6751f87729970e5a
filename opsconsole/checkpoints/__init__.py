"""Checkpoints: recognise formats, read metadata without loading tensors, check integrity, plan cleanups.

No Textual here, and no torch: a torch zip's data.pkl is read by a restricted unpickler.

    scan.scan_directory(root, fs=LOCAL) -> DirListing           list a directory (any FileSystem)
    remote.SftpFileSystem(link, loop)                            a node's files over its SshLink (SFTP)
    verify.verify_checkpoint(entry, fs, progress, cancelled)    the full CRC check, on demand
    retention.plan_retention(entries, keep=, min_age=, now=)    the pure retention plan
    cleanup.plan_directory(listing, fs, keep=, min_age=, now=)  the plan, open-file check included
    cleanup.execute_plan(plan, root, audit, fs=, read_only=)    deletions: root only, audited first
"""
