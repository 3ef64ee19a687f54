from fairseq_plugins.cli.plot_alignment import main

if __name__ == "__main__":
    main()
