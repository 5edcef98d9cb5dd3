"""mpikmeans: k-means clustering of large ARFF data sets over MPI ranks and GPUs."""

__version__ = "0.1.0"
