"""dflash_prep: chat data -> the HDF5 training format of dflash_mpi (data/README.md, "Preparing chat data")."""
