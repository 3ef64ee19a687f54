from fairseq_plugins.cli.benchmark_scale import main

if __name__ == "__main__":
    main()
